"""ComfyUI jobs across real worker and queue-service processes: a restart mid-prompt
completes the job once, and no second prompt is posted."""

import time

import pytest

from comfy_app.models import ComfyInstance
from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project
from tests.fakes.comfyui import WORKFLOW, Script

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fake(fake_comfyui):
    return fake_comfyui


def test_killing_workers_and_queue_service_mid_prompt_completes_the_job_once(owner, fake, tmp_path):
    project = make_project(owner, kind="comfyui", name="Comfy")
    ComfyInstance.objects.create(project=project, base_url=fake.url, workflow=WORKFLOW)
    fake.plan(Script(seconds=4), Script(seconds=0.5), Script(seconds=0.5))
    jobs = make_drafts(project, 3)
    logs = tmp_path / "logs"
    cluster, service = procs.qcluster(logs, workers=2), procs.queue_service(logs)
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(lambda: fake.running is not None and len(fake.posted) == 2, timeout=60, message="two prompts posted")
        cluster.kill()
        service.kill()
        killed = len(fake.posted)
        time.sleep(1)
        cluster, service = procs.qcluster(logs, workers=2), procs.queue_service(logs)
        procs.wait_for(
            lambda: not Job.objects.filter(id__in=[j.id for j in jobs], status__in=[Status.PENDING, Status.PROCESSING]).exists(),
            timeout=90,
            message="three settled jobs",
        )
    finally:
        cluster.stop()
        service.stop()
    # With their reasons, so that a failure says why.
    settled = [(job.status, job.error) for job in Job.objects.filter(id__in=[j.id for j in jobs])]
    assert settled == [(Status.COMPLETED, "")] * 3
    assert killed == 2
    assert len(fake.posted) == 3  # one prompt per job: nothing was posted twice
    assert len({p["prompt_id"] for p in fake.posted}) == 3
    assert fake.max_in_flight <= 2
    for job in jobs:
        assert AlbumItem.objects.filter(job=job).count() == 1
        assert JobAttempt.objects.filter(job=job, outcome="completed").count() == 1
