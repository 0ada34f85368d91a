"""Issue 33: one attempt per provider call, numbered 1, 2, 3 over the job's life — never a
number skipped or repeated — with a detached task's submit, its time at the provider and
its collection as phases of one attempt, on the job page and in the history."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import dispatch
from queue_app.engine.attempts import attempt_begin, attempt_collect
from queue_app.models import Job, JobAttempt, Provider, Status
from queue_app.queue_service import recovery
from queue_app.selectors import history
from queue_app.services.jobs import jobs_retry, jobs_start
from tests.conftest import make_drafts, make_project, make_provider
from tests.engine_helpers import poll_once

# The worker steps close and reopen their connection (close_old_connections), which a
# test inside one transaction cannot survive.
pytestmark = pytest.mark.django_db(transaction=True)


def started(owner, **options):
    provider = make_provider(owner, **options)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    return provider, job


def work(provider, inline_tasks, rounds: int = 4) -> None:
    """What the workers and the queue service do meanwhile: claim, run, poll, collect."""
    for _ in range(rounds):
        Job.objects.filter(status=Status.PENDING).update(not_before=None)  # no backoff wait
        dispatch.dispatch(provider.id)
        inline_tasks.run()
        poll_once(now=timezone.now() + timedelta(minutes=1))
        inline_tasks.run()


def attempts_of(job) -> list[tuple]:
    return list(JobAttempt.objects.filter(job_id=job.id).order_by("id").values_list("number", "phase", "outcome"))


def expire_lease(job) -> None:
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_a_detached_job_completing_is_one_attempt_with_its_submit_and_collect_phases(owner, inline_tasks, client):
    provider, job = started(owner, mode="async")
    work(provider, inline_tasks)
    assert Job.objects.get(id=job.id).status == Status.COMPLETED
    [attempt] = JobAttempt.objects.filter(job=job)
    assert (attempt.number, attempt.phase, attempt.outcome) == (1, "collect", "completed")
    assert attempt.task_id and attempt.started_at <= attempt.detached_at <= attempt.collecting_at <= attempt.finished_at
    client.force_login(owner)
    html = client.get(f"/jobs/{job.id}/?fragment=1").content.decode()
    assert 'data-count="attempts">1<' in html and 'data-attempt="1"' in html and 'data-attempt="2"' not in html
    assert all(f'data-phase="{phase}"' in html for phase in ("submit", "remote", "collect"))


def test_a_retry_after_a_failure_is_attempt_two(owner, inline_tasks):
    provider, job = started(owner, mode="async", fail_rate=1, fail_kind="permanent")
    work(provider, inline_tasks, rounds=1)
    assert Job.objects.get(id=job.id).status == Status.FAILED
    Provider.objects.filter(id=provider.id).update(options={"mode": "async", "latency_ms": 0})
    jobs_retry(user=owner, job_ids=[job.id])
    work(provider, inline_tasks)
    assert Job.objects.get(id=job.id).status == Status.COMPLETED
    assert attempts_of(job) == [(1, "submit", "permanent"), (2, "collect", "completed")]


def test_a_rate_limited_try_keeps_its_number_and_the_next_call_takes_the_next(owner, inline_tasks):
    # The 429 refunds the job's try (its retry budget), not its place in the log.
    provider, job = started(owner, fail_rate=1, fail_kind="rate_limit", retry_after=1)
    work(provider, inline_tasks, rounds=1)
    Provider.objects.filter(id=provider.id).update(options={"latency_ms": 0}, cooldown_until=None)
    work(provider, inline_tasks, rounds=1)
    assert attempts_of(job) == [(1, "submit", "rate_limited"), (2, "submit", "completed")]
    assert Job.objects.get(id=job.id).attempts == 1


def test_a_heal_after_a_killed_worker_numbers_the_next_attempt_after_the_interrupted_one(owner, inline_tasks):
    provider, job = started(owner)  # claimed at once: its execution waits in the broker
    inline_tasks.queue.clear()  # the worker that took it is killed after opening its attempt
    job = Job.objects.get(id=job.id)
    assert attempt_begin(job, job.lease_token).number == 1
    expire_lease(job)
    assert recovery.heal() == 1
    work(provider, inline_tasks, rounds=1)
    assert attempts_of(job) == [(1, "submit", "interrupted"), (2, "submit", "completed")]


def test_a_claim_healed_before_any_worker_took_it_leaves_no_gap(owner, inline_tasks):
    provider, job = started(owner)  # claimed at once: its execution waits in the broker
    inline_tasks.queue.clear()  # the cluster died with the claim in its queue: no call made
    expire_lease(job)
    assert recovery.heal() == 1
    work(provider, inline_tasks, rounds=1)
    assert attempts_of(job) == [(1, "submit", "completed")]


def test_a_collector_that_died_leaves_the_attempt_to_the_next_collector(owner, inline_tasks):
    provider, job = started(owner, mode="async")
    inline_tasks.run()
    poll_once(now=timezone.now() + timedelta(minutes=1))
    [(_, (job_id, token))] = inline_tasks.queue
    inline_tasks.queue.clear()  # the collector is killed while downloading
    assert attempt_collect(Job.objects.get(id=job_id), token).phase == "collect"
    expire_lease(job)
    recovery.heal()
    assert attempts_of(job) == [(1, "remote", "detached")]  # the poller's again, still open
    work(provider, inline_tasks, rounds=1)
    assert attempts_of(job) == [(1, "collect", "completed")]


def test_the_history_counts_a_detached_then_collected_attempt_once(owner, inline_tasks):
    provider, job = started(owner, mode="async")
    inline_tasks.run()
    # While the task runs at the provider, nothing has ended: no count, no run time yet.
    assert history.attempt_outcomes()["detached"] == 1 and history.duration_histogram("run")["count"] == 0
    work(provider, inline_tasks)
    outcomes = history.attempt_outcomes()
    assert outcomes["completed"] == 1 and sum(outcomes.values()) == 1
    [series] = history.throughput(range_name="hour")["providers"].values()
    assert (sum(series["completed"]), sum(series["failed"])) == (1, 0)
    assert history.failure_rates() == {provider.id: (0, 1)}
    assert history.duration_histogram("run")["count"] == 1 and history.duration_histogram("wait")["count"] == 1
