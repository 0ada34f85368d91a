"""The queue with real worker processes: the concurrency limit across clusters, and
recovery after a worker is SIGKILLed mid-job."""

import time

import pytest

from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.providers import demo
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def count(status) -> int:
    return Job.objects.filter(status=status).count()


@pytest.mark.postgres
def test_two_clusters_hold_the_provider_limit_exactly(owner, tmp_path):
    provider = make_provider(owner, concurrency=3, latency_ms=150)
    project = make_project(owner, provider)
    make_drafts(project, 60)
    logs = tmp_path / "logs"
    running = [procs.qcluster(logs, workers=4), procs.qcluster(logs, workers=4), procs.queue_service(logs)]
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(lambda: count(Status.COMPLETED) == 60, timeout=180, message="60 completed jobs")
    finally:
        for proc in running:
            proc.stop()
    assert demo.peak_inflight(provider.id) == 3
    assert len(demo.calls(provider.id)) == 60
    assert AlbumItem.objects.filter(project=project).count() == 60
    # the work was shared: both clusters executed jobs
    workers = set(JobAttempt.objects.values_list("worker", flat=True))
    assert len({w.split(":")[1] for w in workers}) >= 2


def test_sigkilled_worker_mid_job_is_healed_and_the_job_completes_once(owner, tmp_path):
    provider = make_provider(owner, concurrency=1, latency_ms=4000)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    logs = tmp_path / "logs"
    cluster, service = procs.qcluster(logs, workers=2), procs.queue_service(logs)
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(
            lambda: Job.objects.filter(id=job.id, status=Status.PROCESSING).exclude(lease_owner="").exists(),
            timeout=60,
            message="a worker running the job",
        )
        cluster.kill()
        killed_at = time.monotonic()
        # Healed: the interrupted attempt is recorded and the job is dispatchable again
        # (the queue service re-claims it at once, so it may already be processing).
        procs.wait_for(lambda: JobAttempt.objects.filter(job=job, outcome="interrupted").exists(), timeout=30, message="healing")
        healed_after = time.monotonic() - killed_at
        cluster = procs.qcluster(logs, workers=2)
        procs.wait_for(lambda: Job.objects.filter(id=job.id, status=Status.COMPLETED).exists(), timeout=60, message="completion")
    finally:
        cluster.stop()
        service.stop()
    assert healed_after < 15
    assert AlbumItem.objects.filter(job=job).count() == 1
    outcomes = sorted(JobAttempt.objects.filter(job=job).values_list("outcome", flat=True))
    assert outcomes == ["completed", "interrupted"]
