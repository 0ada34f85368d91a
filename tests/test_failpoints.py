"""Each named failpoint, deterministically: the process exits at exactly that instruction,
then a clean worker and queue service take over, and the job ends completed once —
one album item, and a remote submission count that says what the crash cost."""

import pytest

from queue_app.engine import heartbeats
from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.providers import demo
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def _worker_died(job) -> bool:
    """The job's attempt was recorded by a worker process that no longer exists."""
    for worker in JobAttempt.objects.filter(job=job).values_list("worker", flat=True):
        _, _, pid = worker.rpartition(":")
        if pid.isdigit() and not heartbeats.pid_alive(int(pid)):
            return True
    return False


def _crash_in_worker(owner, tmp_path, failpoint: str, **options):
    """Run one job on a cluster whose workers exit at `failpoint`; return the job after the
    crash, with the crashing cluster stopped."""
    provider = make_provider(owner, concurrency=1, latency_ms=200, **options)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    logs = tmp_path / "logs"
    cluster = procs.qcluster(logs, workers=1, FAILPOINTS=failpoint)
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(lambda: _worker_died(job), timeout=60, message=f"a worker to exit at {failpoint}")
    except AssertionError:
        print(Job.objects.filter(id=job.id).values().first(), list(JobAttempt.objects.filter(job=job).values()))
        print(cluster.log()[-3000:])
        raise
    finally:
        cluster.stop()
    job.refresh_from_db()
    return provider, project, job


def _recover_and_finish(job, tmp_path, **service_env):
    logs = tmp_path / "logs"
    cluster, service = procs.qcluster(logs, workers=2), procs.queue_service(logs, **service_env)
    try:
        procs.wait_for(
            lambda: Job.objects.filter(id=job.id, status__in=[Status.COMPLETED, Status.FAILED]).exists(),
            timeout=90,
            message="the job to finish after recovery",
        )
    except AssertionError:
        # What a failure needs to be read: the job, its attempts, the processes' logs.
        print(Job.objects.filter(id=job.id).values().first(), list(JobAttempt.objects.filter(job=job).values()))
        print(cluster.log()[-3000:], service.log()[-3000:])
        raise
    finally:
        cluster.stop()
        service.stop()
    job.refresh_from_db()
    return job


def _album_files(settings) -> list:
    root = settings.MEDIA_ROOT / "album"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_after_claim_before_submit_nothing_was_sent_and_the_retry_sends_once(owner, tmp_path):
    provider, _, job = _crash_in_worker(owner, tmp_path, "after_claim_before_submit")
    assert job.status == Status.PROCESSING and job.task_id == ""
    assert demo.calls(provider.id) == []
    job = _recover_and_finish(job, tmp_path)
    assert job.status == Status.COMPLETED
    assert len(demo.calls(provider.id)) == 1
    assert AlbumItem.objects.filter(job=job).count() == 1
    assert sorted(JobAttempt.objects.filter(job=job).values_list("outcome", flat=True)) == ["completed", "interrupted"]


def test_after_submit_before_task_id_costs_exactly_one_extra_submission(owner, tmp_path):
    provider, _, job = _crash_in_worker(owner, tmp_path, "after_submit_before_task_id", mode="async")
    # The provider accepted a task whose id we never stored: the one case that pays twice.
    assert len(demo.calls(provider.id)) == 1 and job.task_id == ""
    job = _recover_and_finish(job, tmp_path)
    assert job.status == Status.COMPLETED
    assert len(demo.calls(provider.id)) == 2
    assert AlbumItem.objects.filter(job=job).count() == 1


def test_after_download_before_album_writes_no_item_then_one(owner, tmp_path, settings):
    provider, _, job = _crash_in_worker(owner, tmp_path, "after_download_before_album")
    assert len(demo.calls(provider.id)) == 1
    assert AlbumItem.objects.filter(job=job).count() == 0 and _album_files(settings) == []
    job = _recover_and_finish(job, tmp_path)
    assert job.status == Status.COMPLETED
    assert AlbumItem.objects.filter(job=job).count() == 1
    assert len(_album_files(settings)) == 1


def test_after_album_before_complete_rolls_back_and_overwrites_the_same_file(owner, tmp_path, settings):
    provider, _, job = _crash_in_worker(owner, tmp_path, "after_album_before_complete")
    # The transaction died with the process: no item, the job still holds its slot.
    assert job.status == Status.PROCESSING
    assert AlbumItem.objects.filter(job=job).count() == 0
    job = _recover_and_finish(job, tmp_path)
    assert job.status == Status.COMPLETED
    item = AlbumItem.objects.get(job=job)
    # The retry renamed its output onto the same name: one file, the item's.
    assert [p.name for p in _album_files(settings)] == [item.file.name.rsplit("/", 1)[1]]


def test_mid_poll_the_queue_service_dies_and_the_task_is_collected_not_resubmitted(owner, tmp_path):
    provider = make_provider(owner, concurrency=1, latency_ms=300, mode="async")
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    logs = tmp_path / "logs"
    cluster = procs.qcluster(logs, workers=1)
    service = procs.queue_service(logs, FAILPOINTS="mid_poll")
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(lambda: not service.alive(), timeout=60, message="the queue service to exit mid poll")
        assert service.popen.returncode == 137
        job.refresh_from_db()
        assert job.status == Status.PROCESSING and job.task_id.startswith("demo:")
    finally:
        cluster.stop()
        service.stop()
    job = _recover_and_finish(job, tmp_path)
    assert job.status == Status.COMPLETED
    assert len(demo.calls(provider.id)) == 1
    assert AlbumItem.objects.filter(job=job).count() == 1
