"""Reconcile before paying again, with real workers and the provider fakes: a worker
SIGKILLed right after the provider accepted the create (before the task id was stored)
leaves a task the next attempt finds by its tag (Civitai) or input and creation time
(Replicate) and adopts — exactly one task at the fake per job, one album item."""

import pytest

from queue_app.models import AlbumItem, Job, JobAttempt, Provider, Status
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project
from tests.fakes.chaos_provider import ChaosProvider
from tests.fakes.civitai import FakeCivitai
from tests.test_failpoints import _recover_and_finish, _worker_died

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SDXL = "urn:air:sdxl:checkpoint:civitai:101055@128078"
FLUX = "black-forest-labs/flux-schnell"


@pytest.fixture
def loopback(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    settings.OUTBOUND_ALLOW_HTTP = True


def _provider(owner, family: str, base_url: str, key: str) -> Provider:
    provider = Provider(owner=owner, name=family, family=family, base_url=base_url, concurrency=1, max_attempts=4)
    provider.api_key = key
    provider.save()
    return provider


def _killed_after_create_then_recovered(owner, tmp_path, provider, model: str) -> Job:
    project = make_project(owner, provider, model=model)
    [job] = make_drafts(project, prompt="chaos-job-7 a lighthouse")
    cluster = procs.qcluster(tmp_path / "logs", workers=1, FAILPOINTS="after_submit_before_task_id")
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(lambda: _worker_died(job), timeout=60, message="a worker to exit right after the create")
    finally:
        cluster.stop()
    job.refresh_from_db()
    assert job.task_id == ""  # the provider accepted it; we never stored its id
    return _recover_and_finish(job, tmp_path)


def test_replicate_a_worker_killed_after_the_create_leaves_one_prediction(owner, tmp_path, loopback):
    fake = ChaosProvider(seed=1).start()
    try:
        fake.configure("rep-key", family="replicate", latency=(0.5, 0.8))
        provider = _provider(owner, "replicate", f"{fake.url}/v1", "rep-key")
        job = _killed_after_create_then_recovered(owner, tmp_path, provider, FLUX)
        assert job.status == Status.COMPLETED, job.error
        assert fake.submissions_per_job() == {"7": 1}
        [prediction] = fake.predictions
    finally:
        fake.stop()
    assert AlbumItem.objects.filter(job=job).count() == 1
    assert _attempts(job) == [("interrupted", ""), ("completed", prediction)]


def test_civitai_a_worker_killed_after_the_create_leaves_one_workflow(owner, tmp_path, loopback):
    with FakeCivitai() as fake:
        provider = _provider(owner, "civitai", fake.url, "civ-key")
        job = _killed_after_create_then_recovered(owner, tmp_path, provider, SDXL)
        assert job.status == Status.COMPLETED, job.error
        assert fake.per_job() == {str(job.id): 1}
        [workflow] = fake.workflows.values()
        # Found by the tag of the attempt the worker died in, and adopted by the next one.
        assert workflow["tags"] == [f"rs-job-{job.id}", f"rs-{job.id}-1"]
    assert AlbumItem.objects.filter(job=job).count() == 1
    assert _attempts(job) == [("interrupted", ""), ("completed", workflow["id"])]


def _attempts(job) -> list[tuple[str, str]]:
    return list(JobAttempt.objects.filter(job=job).order_by("number").values_list("outcome", "task_id"))


def test_a_lost_task_keeps_its_place_and_the_provider_never_sees_more_than_the_limit(owner, tmp_path, loopback):
    """Three jobs on a record of limit 1; the first one's worker dies right after its
    create. Its lost prediction is adopted, and no other job's prediction ran beside it."""
    fake = ChaosProvider(seed=2).start()
    try:
        fake.configure("rep-key", family="replicate", latency=(1.5, 2.0))
        provider = _provider(owner, "replicate", f"{fake.url}/v1", "rep-key")
        project = make_project(owner, provider, model=FLUX)
        jobs = [make_drafts(project, prompt=f"chaos-job-{n} a lighthouse")[0] for n in range(3)]
        cluster = procs.qcluster(tmp_path / "logs", workers=1, FAILPOINTS="after_submit_before_task_id")
        try:
            jobs_start(user=owner, project=project, all_drafts=True)
            procs.wait_for(lambda: any(_worker_died(job) for job in jobs), timeout=60, message="a worker to exit")
        finally:
            cluster.stop()
        for job in jobs:
            _recover_and_finish(job, tmp_path)
        assert fake.submissions_per_job() == {"0": 1, "1": 1, "2": 1}
        assert fake.peak_inflight("rep-key") == 1 and fake.orphans("rep-key") == 0
    finally:
        fake.stop()
    assert set(Job.objects.filter(project=project).values_list("status", flat=True)) == {Status.COMPLETED}


def test_a_job_cancelled_after_its_worker_died_mid_submission_has_its_task_cancelled(owner, tmp_path, loopback):
    """The worker died right after the create; the user cancels the job before anything
    adopted the task. The queue service finds the task by its input and time and cancels it
    at the provider within one poll cycle."""
    from queue_app.queue_service import orphans
    from queue_app.services.jobs import jobs_cancel

    fake = ChaosProvider(seed=4).start()
    try:
        fake.configure("rep-key", family="replicate", latency=(120, 121))  # runs (and bills) on
        provider = _provider(owner, "replicate", f"{fake.url}/v1", "rep-key")
        project = make_project(owner, provider, model=FLUX)
        [job] = make_drafts(project, prompt="chaos-job-3 a lighthouse")
        cluster = procs.qcluster(tmp_path / "logs", workers=1, FAILPOINTS="after_submit_before_task_id")
        try:
            jobs_start(user=owner, project=project, all_drafts=True)
            procs.wait_for(lambda: _worker_died(job), timeout=60, message="a worker to exit right after the create")
        finally:
            cluster.stop()
        jobs_cancel(user=owner, job_ids=[job.id])
        [prediction] = fake.predictions
        service = procs.queue_service(tmp_path / "logs")
        try:
            procs.wait_for(
                lambda: fake.predictions[prediction].canceled,
                timeout=orphans.SWEEP_SECONDS + 15,
                message="the orphan to be cancelled at the provider",
            )
        finally:
            service.stop()
        assert fake.submissions_per_job() == {"3": 1}
    finally:
        fake.stop()
    assert JobAttempt.objects.get(job=job).task_id == prediction
