"""Fair share with real workers: a small batch started behind a big one on the same
provider overtakes it."""

import pytest

from queue_app.models import Job, Status
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_a_small_batch_overtakes_a_big_one_on_the_same_provider(owner, tmp_path):
    provider = make_provider(owner, concurrency=2, latency_ms=300)
    big, small = make_project(owner, provider, name="big"), make_project(owner, provider, name="small")
    make_drafts(big, 200)
    make_drafts(small, 5)
    logs = tmp_path / "logs"
    running = [procs.qcluster(logs, workers=3), procs.queue_service(logs)]
    try:
        jobs_start(user=owner, project=big, all_drafts=True)
        procs.wait_for(
            lambda: Job.objects.filter(project=big, status=Status.COMPLETED).count() >= 4, timeout=120, message="big running"
        )
        jobs_start(user=owner, project=small, all_drafts=True)
        procs.wait_for(
            lambda: Job.objects.filter(project=small, status=Status.COMPLETED).count() == 5, timeout=120, message="small done"
        )
        # Oldest first alone would have run the ~196 older jobs first.
        assert Job.objects.filter(project=big, status=Status.PENDING).count() > 150
    finally:
        for proc in running:
            proc.stop()


def test_a_job_moved_to_the_front_is_claimed_next_by_real_workers(owner, tmp_path):
    from django.utils import timezone

    from queue_app.services.priority import jobs_run_next

    provider = make_provider(owner, concurrency=1, latency_ms=300)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 40)
    logs = tmp_path / "logs"
    running = [procs.qcluster(logs, workers=2), procs.queue_service(logs)]
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(
            lambda: Job.objects.filter(project=project, status=Status.COMPLETED).count() >= 2, timeout=120, message="running"
        )
        moved_at = timezone.now()
        last = str(jobs[-1].id)
        assert jobs_run_next(user=owner, job_ids=[last])["moved"] == [last]
        procs.wait_for(
            lambda: Job.objects.filter(id=last, status=Status.COMPLETED).exists(), timeout=60, message="moved job done"
        )
        # A claim already under way when it was moved may go first: at most one other.
        before = Job.objects.filter(project=project, started_at__gte=moved_at, started_at__lt=Job.objects.get(id=last).started_at)
        assert before.count() <= 1
        assert Job.objects.filter(project=project, status=Status.PENDING).count() > 20
    finally:
        for proc in running:
            proc.stop()
