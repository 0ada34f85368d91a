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
