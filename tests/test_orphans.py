"""Orphans (queue_service/orphans.py): a task a lost submission left at the provider is
cancelled there once its job has ended, and left for the job's own next attempt to adopt
while the job still waits."""

import pytest
import requests
from django.utils import timezone

from queue_app.models import ErrorClass, JobAttempt, Provider, Status
from queue_app.queue_service import orphans
from tests.conftest import make_job, make_project
from tests.fakes.chaos_provider import ChaosProvider

pytestmark = pytest.mark.django_db
FLUX = "black-forest-labs/flux-schnell"


@pytest.fixture
def fake(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    server = ChaosProvider(seed=5).start()
    server.configure("rep-key", family="replicate", latency=(60, 61))  # still running when swept
    yield server
    server.stop()


def _lost_submission(owner, fake, status, **fields):
    """A job whose attempt 1 created a prediction at the fake and died before storing its id."""
    provider = Provider(owner=owner, name="r", family="replicate", base_url=f"{fake.url}/v1", concurrency=1)
    provider.api_key = "rep-key"
    provider.save()
    project = make_project(owner, provider, model=FLUX)
    job = make_job(project, status, resolved={"model": FLUX, "kind": "image"}, **fields)
    now = timezone.now()
    JobAttempt.objects.create(job=job, number=1, outcome=JobAttempt.Outcome.INTERRUPTED, provider_id=provider.id, finished_at=now)
    body = {"version": FLUX, "input": {"prompt": job.prompt}}
    created = requests.post(f"{fake.url}/v1/predictions", json=body, headers={"Authorization": "Bearer rep-key"}, timeout=5)
    return job, created.json()["id"]


def test_a_cancelled_jobs_lost_task_is_cancelled_at_the_provider_once(owner, fake):
    job, prediction = _lost_submission(owner, fake, Status.FAILED, error_class=ErrorClass.CANCELLED)
    assert orphans.sweep() == 1
    assert fake.predictions[prediction].canceled
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.task_id == prediction and "cancelled at the provider" in attempt.reason
    assert orphans.sweep() == 0  # settled: the row names it now


def test_a_waiting_jobs_lost_task_is_left_for_its_next_attempt_to_adopt(owner, fake):
    job, prediction = _lost_submission(owner, fake, Status.PENDING)
    assert orphans.sweep() == 0
    assert not fake.predictions[prediction].canceled
    assert JobAttempt.objects.get(job=job).task_id == ""


def test_a_completed_jobs_lost_civitai_workflow_is_found_by_its_tag_and_cancelled(owner, settings):
    from tests.fakes.civitai import FakeCivitai

    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    with FakeCivitai(polls_before_done=100) as civitai:
        provider = Provider(owner=owner, name="c", family="civitai", base_url=civitai.url, concurrency=1)
        provider.api_key = "civ-key"
        provider.save()
        project = make_project(owner, provider, model="urn:air:sdxl:checkpoint:civitai:101055@128078")
        job = make_job(project, Status.COMPLETED, resolved={"model": project.model, "kind": "image"})
        JobAttempt.objects.create(
            job=job, number=2, outcome=JobAttempt.Outcome.AMBIGUOUS, provider_id=provider.id, finished_at=timezone.now()
        )
        body = {"tags": [f"rs-job-{job.id}", f"rs-{job.id}-2"], "metadata": {"jobId": str(job.id)}}
        lost = requests.post(f"{civitai.url}/v2/consumer/workflows", json=body, headers={"Authorization": "Bearer k"}, timeout=5)
        workflow = lost.json()["id"]
        assert orphans.sweep() == 1
        assert civitai.workflows[workflow]["canceled"]
    assert JobAttempt.objects.get(job=job).task_id == workflow


@pytest.mark.django_db(transaction=True)  # the sweep's thread reads committed rows
def test_the_queue_service_sweeps_on_a_thread_of_its_own(owner, fake):
    from queue_app.queue_service.loop import QueueService

    job, prediction = _lost_submission(owner, fake, Status.FAILED, error_class=ErrorClass.CANCELLED)
    service = QueueService()
    assert service.step_orphans() is False  # the loop goes on at once: heal and dispatch wait for no provider
    service.orphan_sweep.join(timeout=30)
    assert fake.predictions[prediction].canceled
    assert JobAttempt.objects.get(job=job).task_id == prediction
