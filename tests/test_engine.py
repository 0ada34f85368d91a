"""The queue engine in one process: start, dispatch, execute, fail, retry, clear."""

import uuid

import pytest
from django.utils import timezone

from queue_app.engine import dispatch, transitions
from queue_app.models import AlbumItem, Job, JobAttempt, Provider, Status
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import failed_jobs_clear, jobs_retry, jobs_start
from queue_app.services.providers import provider_set_concurrency, provider_set_paused
from tests.conftest import make_drafts, make_project, make_provider, status_of, statuses

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_runs_started_drafts_to_completed_with_one_album_item_each(owner, project, inline_tasks):
    jobs = make_drafts(project, 3)
    result = jobs_start(user=owner, project=project, all_drafts=True)
    assert len(result["started"]) == 3
    # concurrency 1: exactly one job claimed, the rest queued
    assert statuses(jobs).count(Status.PROCESSING) == 1
    inline_tasks.run()
    assert statuses(jobs) == [Status.COMPLETED] * 3
    assert AlbumItem.objects.filter(job__in=jobs).count() == 3
    item = AlbumItem.objects.get(job=jobs[0])
    assert item.kind == "image" and item.size > 0 and item.width and item.metadata["model"] == "demo-image"
    assert Job.objects.filter(slot__isnull=False).count() == 0


def test_it_claims_into_free_slots_in_start_order(owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 4)
    jobs_start(user=owner, project=project, job_ids=[j.id for j in reversed(jobs)])
    processing = Job.objects.filter(status=Status.PROCESSING).order_by("slot")
    assert [j.slot for j in processing] == [0, 1]
    assert len(inline_tasks.executions()) == 2


def test_start_all_drafts_never_duplicates_pending_or_processing(owner, project, inline_tasks):
    jobs = make_drafts(project, 2)
    first = jobs_start(user=owner, project=project, all_drafts=True)
    again = jobs_start(user=owner, project=project, all_drafts=True)
    selected_again = jobs_start(user=owner, project=project, job_ids=[j.id for j in jobs])
    assert len(first["started"]) == 2 and again["started"] == [] and selected_again["started"] == []
    assert Job.objects.count() == 2


def test_start_refuses_jobs_of_another_project(owner, project, provider, inline_tasks):
    other = make_project(owner, provider, name="Other")
    foreign = make_drafts(other, 1)
    with pytest.raises(ServiceError):
        jobs_start(user=owner, project=project, job_ids=[foreign[0].id])
    assert status_of(foreign[0]) == Status.DRAFT


def test_storage_estimate_refuses_the_whole_start_and_changes_nothing(owner, project, inline_tasks):
    owner.account.storage_limit_bytes = 60 * 1024 * 1024  # room for two 25 MB estimates
    owner.account.save()
    Provider.objects.filter(id=project.provider_id).update(paused=True)
    first = make_drafts(project, 2)
    jobs_start(user=owner, project=project, job_ids=[j.id for j in first])
    more = make_drafts(project, 1, prompt="one too many")
    with pytest.raises(ServiceError) as refused:
        jobs_start(user=owner, project=project, job_ids=[more[0].id])
    assert "Storage limit exceeded" in refused.value.message and refused.value.code == 403
    assert status_of(more[0]) == Status.DRAFT


def test_permanent_failure_fails_the_job_with_the_reason(owner, inline_tasks):
    provider = make_provider(owner, fail_rate=1, fail_kind="permanent")
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_class == "permanent" and "refused" in job.error
    assert job.slot is None
    assert JobAttempt.objects.get(job=job).outcome == "permanent"


def test_transient_failures_back_off_then_give_up_after_max_attempts(owner, inline_tasks, settings):
    settings.BACKOFF_BASE_SECONDS = 0
    provider = make_provider(owner, fail_rate=1)
    provider.max_attempts = 3
    provider.save()
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.FAILED
    assert job.error.startswith("gave up after 3 attempts, last: ")
    assert JobAttempt.objects.filter(job=job, outcome="transient").count() == 3


def test_transient_failure_sets_not_before_within_the_backoff_bound(owner, inline_tasks, settings):
    settings.BACKOFF_BASE_SECONDS = 10
    provider = make_provider(owner, fail_rate=1)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    before = timezone.now()
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.PENDING and job.attempts == 1
    assert before <= job.not_before <= timezone.now() + timezone.timedelta(seconds=10)
    assert dispatch.dispatch(provider.id) == [] or job.not_before <= timezone.now()


def test_rate_limit_cools_the_provider_down_and_refunds_the_attempt(owner, inline_tasks):
    provider = make_provider(owner, fail_rate=1, fail_kind="rate_limit", retry_after=30)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    provider.refresh_from_db()
    assert provider.cooldown_until > timezone.now() + timezone.timedelta(seconds=25)
    assert statuses(jobs) == [Status.PENDING, Status.PENDING]
    assert Job.objects.get(id=jobs[0].id).attempts == 0
    # cooling down: nothing is dispatched, however often we ask
    assert dispatch.dispatch(provider.id) == []
    assert dispatch.ping_safety_net() == 0


def test_a_stale_worker_writes_nothing(owner, project, inline_tasks, settings):
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    [(job_id, token)] = inline_tasks.executions()
    # The job is taken from this worker (healed after its lease lapsed) and re-claimed.
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timezone.timedelta(seconds=1))
    assert transitions.jobs_heal([job.id], reason="test") == [job.id]
    inline_tasks.run()  # the stale execution runs first: fenced out
    job.refresh_from_db()
    assert job.status == Status.COMPLETED
    assert AlbumItem.objects.filter(job=job).count() == 1
    stale = JobAttempt.objects.filter(job=job).count()
    assert stale == 1  # only the fresh execution got to record an attempt


def test_retry_moves_failed_jobs_back_and_keeps_the_task_id(owner, project, inline_tasks):
    [job] = make_drafts(project)
    Job.objects.filter(id=job.id).update(status=Status.FAILED, task_id="demo:x:0", error="disk full", error_class="local")
    Provider.objects.filter(id=project.provider_id).update(paused=True)
    result = jobs_retry(user=owner, job_ids=[job.id])
    job.refresh_from_db()
    assert result["retried"] == [str(job.id)]
    assert job.status == Status.PENDING and job.task_id == "demo:x:0" and job.error == ""


def test_retry_after_local_failure_collects_the_existing_result_without_submitting(owner, inline_tasks):
    provider = make_provider(owner, mode="async", latency_ms=0)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job.refresh_from_db()
    task_id = job.task_id
    assert job.status == Status.PROCESSING and task_id
    # A local failure after the provider succeeded: the job fails but keeps the task id.
    assert transitions.job_fail(job.id, job.lease_token, reason="disk full", error_class="local")
    from queue_app.providers import demo

    submissions_before = len(demo.calls(provider.id))
    jobs_retry(user=owner, job_ids=[job.id])
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.task_id == task_id
    assert len(demo.calls(provider.id)) == submissions_before  # no second submission
    assert AlbumItem.objects.filter(job=job).count() == 1


@pytest.mark.parametrize("scope", ["all", "project", "provider"])
def test_clear_failed_by_scope_leaves_album_items_and_other_scopes(owner, scope, inline_tasks):
    p1, p2 = make_provider(owner, name="A"), make_provider(owner, name="B")
    a, b = make_project(owner, p1, name="PA"), make_project(owner, p2, name="PB")
    [ja], [jb] = make_drafts(a), make_drafts(b)
    item = AlbumItem.objects.create(project=a, owner=owner, job=ja, kind="image", size=1)
    Job.objects.filter(id__in=[ja.id, jb.id]).update(status=Status.FAILED, error="x")
    kwargs = {"all": {}, "project": {"project_id": a.id}, "provider": {"provider_id": p1.id}}[scope]
    result = failed_jobs_clear(user=owner, **kwargs)
    assert not Job.objects.filter(id=ja.id).exists()
    assert Job.objects.filter(id=jb.id).exists() == (scope != "all")
    assert result["cleared"] == (2 if scope == "all" else 1)
    item.refresh_from_db()
    assert item.job_id is None


def test_clear_failed_never_touches_another_users_jobs(owner, outsider, inline_tasks):
    theirs = make_project(outsider, make_provider(outsider))
    [job] = make_drafts(theirs)
    Job.objects.filter(id=job.id).update(status=Status.FAILED)
    assert failed_jobs_clear(user=owner)["cleared"] == 0
    with pytest.raises(ServiceError):
        failed_jobs_clear(user=owner, project_id=theirs.id)
    assert Job.objects.filter(id=job.id).exists()


def test_raising_concurrency_dispatches_at_once_and_lowering_cancels_nothing(owner, inline_tasks):
    provider = make_provider(owner, concurrency=1)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 4)
    jobs_start(user=owner, project=project, all_drafts=True)
    assert statuses(jobs).count(Status.PROCESSING) == 1
    provider_set_concurrency(user=owner, provider_id=provider.id, concurrency=3)
    assert statuses(jobs).count(Status.PROCESSING) == 3
    provider_set_concurrency(user=owner, provider_id=provider.id, concurrency=1)
    assert statuses(jobs).count(Status.PROCESSING) == 3


def test_a_lowered_limit_claims_nothing_while_work_in_a_higher_slot_still_runs(owner, inline_tasks):
    """Found by the state machine: concurrency 2 → 1 while slots 0 and 1 run; slot 0
    finishes. Slot 0 is free by number, but the one running job already fills the limit."""
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    first, second, waiting = make_drafts(project, 3)
    jobs_start(user=owner, project=project, job_ids=[first.id, second.id])
    slots = dict(Job.objects.filter(status=Status.PROCESSING).values_list("slot", "id"))
    provider_set_concurrency(user=owner, provider_id=provider.id, concurrency=1)
    Provider.objects.filter(id=provider.id).update(options={"latency_ms": 0})
    low = next(args for args in inline_tasks.executions() if args[0] == str(slots[0]))
    inline_tasks.queue = [(func, args) for func, args in inline_tasks.queue if args != low]
    from queue_app import tasks

    tasks.execute_job(*low)  # the job in slot 0 completes
    assert status_of(Job.objects.get(id=slots[0])) == Status.COMPLETED
    jobs_start(user=owner, project=project, job_ids=[waiting.id])
    assert dispatch.dispatch(provider.id) == []
    assert list(Job.objects.filter(status=Status.PROCESSING).values_list("slot", flat=True)) == [1]
    assert status_of(waiting) == Status.PENDING


def test_paused_provider_dispatches_nothing_until_resumed(owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    provider_set_paused(user=owner, provider_id=provider.id, paused=True)
    jobs = make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    assert statuses(jobs) == [Status.PENDING] * 2
    provider_set_paused(user=owner, provider_id=provider.id, paused=False)
    assert statuses(jobs) == [Status.PROCESSING] * 2


def test_text_and_audio_results_become_album_items(owner, inline_tasks):
    provider = make_provider(owner)
    text_project = make_project(owner, provider, kind="text", model="demo-text")
    audio_project = make_project(owner, provider, kind="audio", model="demo-audio")
    [t], [a] = make_drafts(text_project), make_drafts(audio_project)
    jobs_start(user=owner, project=text_project, all_drafts=True)
    jobs_start(user=owner, project=audio_project, all_drafts=True)
    inline_tasks.run()
    text_item, audio_item = AlbumItem.objects.get(job=t), AlbumItem.objects.get(job=a)
    assert text_item.kind == "text" and "Demo answer" in text_item.text
    assert audio_item.kind == "audio" and audio_item.content_type == "audio/wav" and audio_item.size > 1000


def test_over_quota_result_fails_the_job_and_leaves_no_file(owner, project, inline_tasks, settings):
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    owner.account.storage_limit_bytes = 10  # the estimate passed; the real size does not
    owner.account.save()
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.FAILED and "storage limit" in job.error
    assert not AlbumItem.objects.filter(job=job).exists()
    files = [p for p in (settings.MEDIA_ROOT).rglob("*") if p.is_file()]
    assert files == []


def test_snapshot_resolves_the_effective_provider_and_closest_shape(owner, inline_tasks):
    provider = make_provider(owner)
    project = make_project(owner, provider, aspect_ratio="1536x1024")
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    job.refresh_from_db()
    assert job.resolved["provider_id"] == provider.id
    assert job.resolved["aspect_ratio"] == "3:2"
    # later project edits do not change the job in flight
    project.aspect_ratio = "9:16"
    project.save()
    inline_tasks.run()
    assert AlbumItem.objects.get(job=job).metadata["aspect_ratio"] == "3:2"


def test_an_account_problem_pauses_the_provider_and_keeps_the_jobs_queued(owner, inline_tasks):
    from queue_app.selectors.queue import queue_status

    provider = make_provider(owner, concurrency=2, fail_rate=1, fail_kind="account")
    project = make_project(owner, provider)
    jobs = make_drafts(project, 3)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    provider.refresh_from_db()
    assert provider.paused and "no credit" in provider.paused_reason
    assert statuses(jobs) == [Status.PENDING] * 3
    assert all(job.attempts == 0 for job in Job.objects.filter(id__in=[j.id for j in jobs]))
    row = queue_status(user=owner, breakdown="providers")["providers"][0]
    assert row["waiting"] == 3 and list(row["waiting_reasons"]) == [f"provider paused: {provider.paused_reason}"]
    # a person fixes the account and resumes: the reason is cleared and the jobs run
    Provider.objects.filter(id=provider.id).update(options={"latency_ms": 0})
    provider_set_paused(user=owner, provider_id=provider.id, paused=False)
    inline_tasks.run()
    assert statuses(jobs) == [Status.COMPLETED] * 3
    assert Provider.objects.get(id=provider.id).paused_reason == ""


def test_a_job_claimed_before_a_429_is_not_sent_into_the_cooldown(owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    assert len(inline_tasks.executions()) == 2
    from queue_app.engine.provider_state import cool_down
    from queue_app.providers import demo

    cool_down(provider.id, 30)  # another job's 429 arrives after both were claimed
    inline_tasks.run()
    assert demo.calls(provider.id) == []
    assert statuses(jobs) == [Status.PENDING] * 2
    assert all(job.attempts == 0 for job in Job.objects.filter(id__in=[j.id for j in jobs]))


def test_the_attempt_is_completed_in_the_same_commit_as_the_job(owner, project, inline_tasks):
    """A worker killed right after the output commit must not leave its attempt "running";
    a fenced write (the job was taken) records nothing."""
    from queue_app.engine import outputs
    from queue_app.providers.base import Output

    first, second = make_drafts(project, 2)
    project.provider.concurrency = 2
    project.provider.save()
    jobs_start(user=owner, project=project, all_drafts=True)
    tokens = {str(job_id): token for job_id, token in inline_tasks.executions()}
    image = Output(kind="text", text="done")

    attempt = JobAttempt.objects.create(job=first, number=1, worker="test:1")
    assert outputs.write_and_complete(first.id, tokens[str(first.id)], [image], attempt_id=attempt.id) == 1
    attempt.refresh_from_db()
    assert (attempt.outcome, attempt.reason) == ("completed", "1 output(s)") and attempt.finished_at is not None

    stale = JobAttempt.objects.create(job=second, number=1, worker="test:1")
    with pytest.raises(outputs.Fenced):
        outputs.write_and_complete(second.id, uuid.uuid4(), [image], attempt_id=stale.id)
    stale.refresh_from_db()
    assert stale.outcome == "running" and status_of(second) == Status.PROCESSING
