"""Executing one claimed job in a worker (the synchronous path and the async hand-off).

The worker goes on only while the job is processing under its lease token (a redelivered
or stale task stops), opens the attempt and keeps the lease renewed while it works. A job
that kept its remote task id (a retry after a local failure) is adopted: running → detached
again, finished → collected, dead → submitted fresh. Otherwise it submits: outputs go
through the output writer, a task id is stored (detached) before anything waits on it.
Failures are classified: permanent fails, transient goes back after a backoff up to the
provider's maximum, a server delay hint cools the provider down. The freed slot is refilled
in the completion's own commit (dispatch.Handover) and the worker runs that job itself,
within CARRY_ON_BUDGET_SECONDS.
"""

import dataclasses
import logging
import time

from django.db import DatabaseError, close_old_connections
from django.db.models.functions import Now

from queue_app import providers
from queue_app.engine import ambiguous, backoff, dispatch, failpoints, ledger, outputs, reconcile, remote_cancel, transitions
from queue_app.engine.attempts import Outcome, attempt_adopted, attempt_begin
from queue_app.engine.leases import LeaseKeeper, leave_to_healing, reconnecting_once
from queue_app.engine.provider_state import cool_down, pause_for_account
from queue_app.engine.results import Applied, retry_or_give_up, store_outputs
from queue_app.engine.snapshot import resolved_job
from queue_app.models import ErrorClass, Job, JobAttempt, Provider, Status
from queue_app.providers import adapter_for, net, poll_seconds
from queue_app.providers.base import (
    AccountError,
    AmbiguousError,
    Finished,
    PermanentError,
    ProviderError,
    Running,
    Submitted,
    TransientError,
)

log = logging.getLogger(__name__)

# How long one worker task keeps refilling its slot before handing back to the broker.
# It also bounds a graceful stop: a qcluster worker cannot see the stop event while it
# carries on, so it takes new jobs until this runs out (60 s kept a SIGTERMed worker
# busy for over 30 s in a chaos run; one broker round trip per 10 s costs nothing).
CARRY_ON_BUDGET_SECONDS = 10


def run(job_id, token) -> None:
    """Execute a claimed job, then keep the freed slot busy with the provider's next job."""
    started = time.monotonic()
    provider_id = Job.objects.filter(id=job_id).values_list("active_provider_id", flat=True).first()
    step = (job_id, token, None)
    while step is not None and provider_id:
        carry_on = time.monotonic() - started < CARRY_ON_BUDGET_SECONDS
        handover = dispatch.Handover(provider_id, carry_on=carry_on)
        with dispatch.refilled_by_caller(provider_id):
            freed = execute_one(*step, handover=handover)
        step = None
        if handover.more_room:
            # The handover refilled only its own slot; another is free besides.
            dispatch.dispatch(provider_id)
        if handover.held is not None:
            # Claimed, and its attempt opened, in the completion's commit.
            job, next_token, attempt = handover.held
            step = (job.id, next_token, (job, attempt))
        elif freed and not handover.done:
            claimed = dispatch.dispatch(provider_id, hold_one=carry_on)
            if claimed and carry_on:
                step = (*claimed[0], None)


def execute_one(job_id, token, opened: tuple | None = None, *, handover=None) -> int | None:
    """Run one claimed job. `opened` is (job, attempt) when a handover claimed it for this
    worker and opened its attempt already. Returns its provider id when the job left its
    slot (so the caller may refill it), else None."""
    if opened is None:
        # A task from the broker: its connection may have sat idle (django-q2 reuses it).
        # A handed-over job comes on a connection that just committed.
        close_old_connections()
        job = Job.objects.select_related("active_provider").fenced(job_id, token).first()
        if job is None or job.task_id and not _adoptable(job):
            return None  # not ours (anymore): a redelivery, or a job healed/cleared meanwhile
        attempt = attempt_begin(job, token)
        if attempt is None:
            return None
    else:
        job, attempt = opened
    provider = job.active_provider
    try:
        # A lost lease stops the provider call: another host may be running the job again.
        with net.abortable() as abort, LeaseKeeper(job.id, token, on_lost=abort) as keeper:
            return _execute(job, token, provider, attempt, keeper, handover, claimed_earlier=opened is None)
    except DatabaseError:
        leave_to_healing(job.id, "executing")
        return None


def _adoptable(job: Job) -> bool:
    # A processing job that already has a task id is normally detached (the poller's);
    # the worker only runs it when it was claimed fresh with a task id kept from a retry,
    # which is marked by a live lease (detached jobs have none).
    return job.lease_expires_at is not None


def _execute(
    job: Job, token, provider: Provider, attempt: JobAttempt, keeper: LeaseKeeper, handover, *, claimed_earlier: bool
) -> int | None:
    adapter = adapter_for(provider.family)
    request = dataclasses.replace(resolved_job(job, provider, submit=True), tag=reconcile.tag(job.id, attempt.number))
    failpoints.hit("after_claim_before_submit")
    # A handover claimed the job a moment ago under the provider's lock, which it takes
    # only when the provider is not cooling down; a claim that waited in the broker may
    # predate a 429 and is checked.
    if claimed_earlier and Provider.objects.filter(id=provider.id, cooldown_until__gt=Now()).exists():
        # Claimed before another job's 429 cooled the provider down: do not send it into
        # the Retry-After window. The attempt is refunded like the 429 itself.
        transitions.job_requeue(
            job.id,
            token,
            reason="not sent: waiting for the provider's rate limit to pass",
            error_class=ErrorClass.TRANSIENT,
            attempt=attempt.id,
            outcome=Outcome.RATE_LIMITED,
            refund_attempt=True,
        )
        return None
    if not job.task_id and not outputs.media_has_room():
        delay = backoff.delay(max(job.attempts, 1))
        transitions.job_requeue(
            job.id,
            token,
            reason=outputs.MEDIA_FULL_REASON,
            error_class=ErrorClass.LOCAL,
            attempt=attempt.id,
            delay=delay,
            refund_attempt=True,
        )
        return None
    try:
        if job.task_id:
            result = _adopt(adapter, job, request)
        else:
            result = _reconcile_or_submit(adapter, job, request, attempt)
    except ProviderError as error:
        result = error
    except Exception as error:  # a bug or an unexpected answer: fail this job, keep the rest running
        log.exception("job %s: unexpected error from the %s adapter", job.id, provider.family)
        reason = f"internal error in the {provider.family} adapter: {type(error).__name__}"
        transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.LOCAL, attempt=attempt.id)
        return provider.id
    return reconnecting_once(job.id, lambda: _apply(job, token, provider, attempt, keeper, result, handover))


def _apply(job: Job, token, provider: Provider, attempt: JobAttempt, keeper: LeaseKeeper, result, handover) -> int | None:
    """Record what the provider answered: a failure, a remote task id, or outputs."""
    if isinstance(result, ProviderError):
        return _handle_failure(job, token, provider, attempt, result)
    if keeper.lost.is_set():
        transitions.job_lost(attempt.id, reason="lease lost while the provider worked")
        _stop_if_cancelled(job, provider, result)
        return None
    if isinstance(result, Submitted):
        failpoints.hit("after_submit_before_task_id")
        seconds = poll_seconds(provider.family)
        if not transitions.job_detach(job.id, token, task_id=result.task_id, poll_seconds=seconds, attempt=attempt.id):
            _stop_if_cancelled(job, provider, result)
        return None
    secrets = (provider.api_key, provider.api_secret)
    cost = ledger.reported(provider, job.resolved, result.usage)
    stored = store_outputs(
        job.id, token, attempt.id, result.outputs, secrets=secrets, disk_full_waits=True, handover=handover, job=job, cost=cost
    )
    return None if stored is Applied.SKIPPED else provider.id


def _stop_if_cancelled(job: Job, provider: Provider, result) -> None:
    """A task submitted while the user cancelled its job: nobody will poll it, so it is
    cancelled at the provider too (best effort, like every remote cancel)."""
    if not isinstance(result, Submitted):
        return
    if Job.objects.filter(id=job.id, status=Status.FAILED, error_class=ErrorClass.CANCELLED).exists():
        remote_cancel.cancel_provider_task(job, provider_id=provider.id, task_id=result.task_id)


def _adopt(adapter, job: Job, request):
    """A retry of a job that still has a remote task id: collect, do not pay again."""
    try:
        state = providers.call(request, adapter.check, job.task_id, request)
    except ProviderError:
        state = Running()  # cannot tell now: keep the task and let the poller look again
    if isinstance(state, Finished):
        return state
    if isinstance(state, Running):
        return Submitted(task_id=job.task_id)
    # Dead or expired: forget it and submit fresh.
    Job.objects.fenced(job.id, job.lease_token).update(task_id="", task_observed_at=None)
    job.task_id = ""
    return providers.call(request, adapter.submit, request)


def _reconcile_or_submit(adapter, job: Job, request, attempt: JobAttempt):
    """Before paying again: a task an earlier attempt may have created is adopted — polled
    if running, collected if finished — and a fresh submission is made only when none is
    found (or every one found is dead). An ambiguous answer is looked up at once."""
    adopted = _adopt_first(adapter, job, request, attempt, reconcile.candidates(adapter, request, job.id, attempt.number))
    if adopted is not None:
        return adopted
    try:
        return providers.call(request, adapter.submit, request)
    except AmbiguousError:
        adopted = _adopt_first(adapter, job, request, attempt, reconcile.own(adapter, request, job.id, attempt))
        if adopted is None:
            raise
        return adopted


def _adopt_first(adapter, job: Job, request, attempt: JobAttempt, task_ids: list[str]):
    for task_id in task_ids:
        try:
            state = providers.call(request, adapter.check, task_id, request)
        except ProviderError:
            state = Running()  # it exists: keep it and let the poller look again
        if isinstance(state, (Finished, Running)):
            log.info("job %s: adopted task %s instead of submitting again", job.id, task_id)
            attempt_adopted(attempt.id, task_id=task_id)
            return state if isinstance(state, Finished) else Submitted(task_id=task_id)
    return None


def _handle_failure(job: Job, token, provider: Provider, attempt: JobAttempt, error: ProviderError) -> int | None:
    reason = error.reason
    if isinstance(error, AccountError):
        # Not this job's fault: pause the provider until a person fixes the account, and
        # keep the job queued for then.
        pause_for_account(provider, reason)
        transitions.job_requeue(
            job.id, token, reason=reason, error_class=ErrorClass.PERMANENT, attempt=attempt.id, refund_attempt=True
        )
        return None
    if isinstance(error, PermanentError):
        transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.PERMANENT, attempt=attempt.id)
        return provider.id
    if isinstance(error, TransientError) and error.delay:
        cool_down(provider.id, error.delay)
        transitions.job_requeue(
            job.id,
            token,
            reason=reason,
            error_class=ErrorClass.TRANSIENT,
            attempt=attempt.id,
            outcome=Outcome.RATE_LIMITED,
            refund_attempt=True,
        )
        dispatch.wake_later(provider.id, error.delay)
        return None  # the provider is cooling down: nothing to refill now
    if isinstance(error, AmbiguousError) and ambiguous.holds(provider.options, job.project.kind, provider.family):
        # The provider may have accepted (and billed) it; this record chose a visible
        # stuck job over a silent second charge.
        reason = f"{ambiguous.HOLD_REASON} ({reason})"
        transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.ATTENTION, attempt=attempt.id)
        return provider.id
    outcome = Outcome.AMBIGUOUS if isinstance(error, AmbiguousError) else Outcome.TRANSIENT
    retry_or_give_up(
        job,
        token,
        max_attempts=provider.max_attempts,
        reason=reason,
        error_class=ErrorClass(error.error_class),
        attempt=attempt.id,
        outcome=outcome,
    )
    return provider.id
