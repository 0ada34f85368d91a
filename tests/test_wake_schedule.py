"""Issue 16 §1: dispatch wakes at the moment work becomes runnable — a cool-down's end, a
backoff's end, a resume — not at the next 3 s safety-net sweep. The service's wake step
is driven directly; the sweep step is never called."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import dispatch, transitions
from queue_app.models import Job, Provider, Status
from queue_app.queue_service.loop import QueueService
from queue_app.services.jobs import jobs_start
from queue_app.services.providers import provider_set_concurrency, provider_set_paused
from queue_app.worker import execute
from tests.conftest import make_drafts, make_project, make_provider, status_of

pytestmark = pytest.mark.django_db(transaction=True)


def queued(owner, provider, n=1, **fields):
    """Pending jobs for a paused provider (nothing dispatches while we set up)."""
    Provider.objects.filter(id=provider.id).update(paused=True)
    project = make_project(owner, provider)
    jobs = make_drafts(project, n, **fields)
    jobs_start(user=owner, project=project, all_drafts=True)
    return jobs


def wait_until(moment):
    time.sleep(max(0.0, (moment - timezone.now()).total_seconds()))


def test_a_cool_down_end_dispatches_at_that_moment(owner, inline_tasks):
    provider = make_provider(owner)
    [job] = queued(owner, provider)
    until = timezone.now() + timedelta(milliseconds=400)
    Provider.objects.filter(id=provider.id).update(paused=False, cooldown_until=until)
    service = QueueService()
    assert service.step_wake() is False
    assert service.wake_at == until
    assert 0 < service.idle_sleep() <= 0.41  # the idle loop will not sleep past the moment
    assert status_of(job) == Status.PENDING
    wait_until(until + timedelta(milliseconds=10))
    started = time.monotonic()
    assert service.step_wake() is True
    assert time.monotonic() - started < 0.1
    assert status_of(job) == Status.PROCESSING
    assert len(inline_tasks.executions()) == 1


def test_a_backoff_end_dispatches_at_that_moment(owner, inline_tasks):
    provider = make_provider(owner)
    [job] = queued(owner, provider)
    until = timezone.now() + timedelta(milliseconds=400)
    Job.objects.filter(id=job.id).update(not_before=until)
    Provider.objects.filter(id=provider.id).update(paused=False)
    service = QueueService()
    service.step_wake()
    assert service.wake_at == until
    assert status_of(job) == Status.PENDING
    wait_until(until + timedelta(milliseconds=10))
    assert service.step_wake() is True
    assert status_of(job) == Status.PROCESSING


def test_a_cool_down_written_after_the_last_read_is_learnt_within_the_refresh(owner, inline_tasks):
    provider = make_provider(owner)
    [job] = queued(owner, provider)
    service = QueueService()
    t0 = timezone.now()
    service.step_wake(now=t0)
    assert service.wake_at is None
    until = t0 + timedelta(milliseconds=300)
    Provider.objects.filter(id=provider.id).update(paused=False, cooldown_until=until)
    service.step_wake(now=t0 + timedelta(milliseconds=100))  # not re-read yet
    assert service.wake_at is None
    service.step_wake(now=t0 + timedelta(milliseconds=260))
    assert service.wake_at == until
    wait_until(until + timedelta(milliseconds=10))
    assert service.step_wake() is True
    assert status_of(job) == Status.PROCESSING


def test_resuming_a_paused_provider_dispatches_at_once(owner, inline_tasks):
    provider = make_provider(owner)
    [job] = queued(owner, provider)
    assert status_of(job) == Status.PENDING
    provider_set_paused(user=owner, provider_id=provider.id, paused=False)
    assert status_of(job) == Status.PROCESSING


def test_a_lowered_limit_refills_the_moment_it_drains(owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    jobs = queued(owner, provider, 3)
    provider_set_paused(user=owner, provider_id=provider.id, paused=False)
    running = [j for j in jobs if status_of(j) == Status.PROCESSING]
    assert len(running) == 2
    provider_set_concurrency(user=owner, provider_id=provider.id, concurrency=1)
    first, second = (Job.objects.get(id=j.id) for j in running)
    [waiting] = [j for j in jobs if j.id not in {first.id, second.id}]
    assert transitions.job_complete(first.id, first.lease_token)
    assert status_of(waiting) == Status.PENDING  # the other job still holds the one slot
    assert transitions.job_complete(second.id, second.lease_token)
    assert status_of(waiting) == Status.PROCESSING  # drained: refilled at once, no sweep


def test_a_workers_429_wakes_dispatch_at_the_cool_downs_end_without_the_queue_service(owner, inline_tasks):
    # The queue service may be down (restarting) when the window closes: the worker that
    # wrote the cool-down has its own timed wake.
    provider = make_provider(owner, fail_rate=1, fail_kind="rate_limit", retry_after=1)
    [job] = queued(owner, provider)
    Provider.objects.filter(id=provider.id).update(paused=False)
    [(job_id, token)] = dispatch.dispatch(provider.id)
    inline_tasks.queue.clear()
    execute.run(job_id, token)  # answered 429, Retry-After 1 s
    assert status_of(job) == Status.PENDING
    until = Provider.objects.values_list("cooldown_until", flat=True).get(id=provider.id)
    assert until is not None
    deadline = time.monotonic() + 3
    while status_of(job) == Status.PENDING and time.monotonic() < deadline:
        time.sleep(0.02)
    claimed_at = timezone.now()
    assert status_of(job) == Status.PROCESSING
    assert until <= claimed_at <= until + timedelta(milliseconds=500)
    assert len(inline_tasks.executions()) == 1
