"""Issue 16 §3: an ambiguous submission (the provider may have accepted it, we hold no
task id) follows the provider record's choice — retry, or hold for attention: a visible
"Needs attention" job on the monitor with Resubmit / Mark failed. Video holds by default."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine.attempts import Outcome
from queue_app.models import ErrorClass, Job, JobAttempt, Provider, Status
from queue_app.queue_service import recovery
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider, status_of

pytestmark = pytest.mark.django_db(transaction=True)


def killed_mid_submission(owner, *, kind, **options):
    """A worker took the job and opened its attempt, then died before a task id was stored."""
    provider = make_provider(owner, **options)
    project = make_project(owner, provider, kind=kind)
    [job] = make_drafts(project, 1)
    jobs_start(user=owner, project=project, all_drafts=True)
    Provider.objects.filter(id=provider.id).update(paused=True)  # what heals stays visible
    Job.objects.filter(id=job.id).update(lease_owner="gone:1", lease_expires_at=timezone.now() - timedelta(seconds=1))
    JobAttempt.objects.create(job=job, number=1, worker="gone:1")
    return job


def test_a_video_job_killed_mid_submission_is_held_for_attention(owner, inline_tasks):
    job = killed_mid_submission(owner, kind="video")
    assert recovery.heal() == 1
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_class == ErrorClass.ATTENTION
    assert "may have accepted" in job.error and job.slot is None
    assert JobAttempt.objects.get(job=job).outcome == Outcome.INTERRUPTED


def test_an_image_job_killed_mid_submission_is_retried_as_before(owner, inline_tasks):
    job = killed_mid_submission(owner, kind="image")
    recovery.heal()
    assert status_of(job) == Status.PENDING


def test_the_provider_record_chooses_retry_or_hold(owner, inline_tasks):
    video = killed_mid_submission(owner, kind="video", on_ambiguous="retry")
    image = killed_mid_submission(owner, kind="image", on_ambiguous="hold")
    recovery.heal()
    assert status_of(video) == Status.PENDING
    assert Job.objects.get(id=image.id).error_class == ErrorClass.ATTENTION


def test_a_claim_no_worker_took_is_retried_even_for_video(owner, inline_tasks):
    provider = make_provider(owner)
    project = make_project(owner, provider, kind="video")
    [job] = make_drafts(project, 1)
    jobs_start(user=owner, project=project, all_drafts=True)
    Provider.objects.filter(id=provider.id).update(paused=True)
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    recovery.heal()
    assert status_of(job) == Status.PENDING  # nothing was sent: no attempt was opened


def test_an_ambiguous_provider_answer_holds_when_the_record_says_hold(owner, inline_tasks):
    provider = make_provider(owner, fail_rate=1, fail_kind="ambiguous", on_ambiguous="hold")
    project = make_project(owner, provider)
    [job] = make_drafts(project, 1)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run(limit=1)
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_class == ErrorClass.ATTENTION
    assert JobAttempt.objects.get(job=job).outcome == Outcome.AMBIGUOUS


def test_the_monitor_lists_held_jobs_and_resubmits_them(client, owner, inline_tasks):
    job = killed_mid_submission(owner, kind="video")
    recovery.heal()
    client.force_login(owner)
    page = client.get("/queue/").content.decode()
    assert "Needs attention" in page and f'data-attention-job="{job.id}"' in page
    response = client.post("/queue/attention/resubmit", {"job": str(job.id), "next": "/queue/"})
    assert response.status_code == 302
    assert status_of(job) == Status.PENDING
    assert "Needs attention" not in client.get("/queue/").content.decode()


def test_mark_failed_takes_a_held_job_off_the_list(client, owner, inline_tasks):
    job = killed_mid_submission(owner, kind="video")
    recovery.heal()
    client.force_login(owner)
    client.post("/queue/attention/mark-failed", {"job": str(job.id)})
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_class == ErrorClass.AMBIGUOUS


def test_another_user_can_neither_see_nor_act_on_a_held_job(client, owner, outsider, inline_tasks):
    job = killed_mid_submission(owner, kind="video")
    recovery.heal()
    client.force_login(outsider)
    assert f'data-attention-job="{job.id}"' not in client.get("/queue/").content.decode()
    client.post("/queue/attention/resubmit", {"job": str(job.id)})
    client.post("/queue/attention/mark-failed", {"job": str(job.id)})
    assert Job.objects.get(id=job.id).error_class == ErrorClass.ATTENTION


def test_bad_job_ids_are_ignored_not_a_500(client, owner):
    client.force_login(owner)
    assert client.post("/queue/attention/resubmit", {"job": "not-a-uuid"}).status_code == 302
    assert client.post("/queue/attention/nonsense", {"job": "x"}).status_code == 302
