"""Detached polling: claiming due detached jobs and checking each one's remote task.

Every detached job carries `next_poll_at`, set from its family's cadence (30 s; Civitai
5 s) when it is detached and after every check. `claim_due` takes due jobs with a short
compare-and-set (a new poll token, `poll_claimed_until`), so two pollers never check one
job at once; `check_job` runs the HTTP check outside any transaction, re-reads the job and
applies the result with fenced writes. A finished task goes to a worker (worker/collect.py);
a failed check never fails a job by itself: the processing timeout does, as does a
provider that refuses POLL_REFUSALS_TO_FAIL checks in a row. The queue service's thread
pool is poll_pool.py, the list-endpoint batches poll_batch.py.
"""

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F

from queue_app import providers
from queue_app.engine import enqueue, events, failpoints, remote_cancel, transitions
from queue_app.engine.attempts import OPEN
from queue_app.engine.clock import db_now
from queue_app.engine.provider_state import pause_for_account
from queue_app.engine.results import Applied, apply_failed, detached_job
from queue_app.engine.snapshot import resolved_job
from queue_app.models import ErrorClass, Job
from queue_app.providers import adapter_for, poll_seconds
from queue_app.providers.base import AccountError, Failed, Finished, PermanentError, ProviderError, Running
from queue_app.queue_service import poll_batch

log = logging.getLogger(__name__)

# A claimed check must finish within this (the adapters' check timeout is 10 s + 30 s);
# after it a crashed poller's claim lapses and another cycle takes the job.
POLL_CLAIM_SECONDS = 120
# A worker collecting a finished task's outputs (downloads of large videos included).
# How long a finished task waits in the broker for a collector before a poll cycle may
# look at it again; once a worker collects, its renewed lease holds the job instead.
COLLECT_CLAIM_SECONDS = settings.CLAIM_TTL_SECONDS
# Failed checks in a row, the last one a refusal (a 4xx other than "unknown task", which
# adapters report as a dead task at once), after which the job fails: one refusal may be
# a provider's hiccup, a run of them will not end before the processing timeout.
POLL_REFUSALS_TO_FAIL = 3


def claim_due(
    *,
    now=None,
    families=None,
    limit: int = 500,
    busy: dict | None = None,
    per_provider: int | None = None,
    allowance: dict | None = None,
    exclude_providers=(),
) -> list[tuple]:
    """Claim detached jobs whose next poll is due. Returns [(job_id, poll_token, provider_id)].

    `busy` maps provider ids to checks already running; with `per_provider`, no provider
    gets more than that many checks at once (the rest wait for a later step). `allowance`
    caps a provider's claims at the status requests its budget allows now;
    `exclude_providers` are checked in batches instead (poll_batch)."""
    now = now or db_now()
    busy = dict(busy or {})
    allowance = dict(allowance or {})
    due = poll_batch.due_jobs(now)
    if families:
        due = due.filter(active_provider__family__in=families)
    if exclude_providers:
        due = due.exclude(active_provider_id__in=list(exclude_providers))
    claimed = []
    rows = due.order_by("next_poll_at").values_list("id", "lease_token", "next_poll_at", "active_provider_id")
    for job_id, old_token, next_poll_at, provider_id in rows[: max(limit * 4, 50)]:
        if len(claimed) >= limit:
            break
        if per_provider is not None and busy.get(provider_id, 0) >= per_provider:
            continue
        if provider_id in allowance and allowance[provider_id] <= 0:
            continue
        token = uuid.uuid4()
        # The compare-and-set on the old token and the due time: of two pollers that read
        # the same row, one changes it and the other matches nothing.
        if (
            Job.objects.fenced(job_id, old_token)
            .filter(next_poll_at=next_poll_at)
            .update(lease_token=token, poll_claimed_until=now + timedelta(seconds=POLL_CLAIM_SECONDS))
        ):
            claimed.append((job_id, token, provider_id))
            busy[provider_id] = busy.get(provider_id, 0) + 1
            if provider_id in allowance:
                allowance[provider_id] -= 1
    return claimed


def _release_claim(job_id, token, *, family: str, now, **fields) -> bool:
    return bool(
        Job.objects.fenced(job_id, token).update(
            next_poll_at=now + timedelta(seconds=poll_seconds(family)), poll_claimed_until=None, **fields
        )
    )


def check_job(job_id, token, *, now=None, turn=None) -> Applied:
    """Check one claimed detached job and apply the result. Returns what happened.
    `turn` waits for the provider's status budget right before the request."""
    now = now or db_now()
    job = detached_job(job_id, token)
    if job is None:
        return Applied.SKIPPED
    provider = job.active_provider
    failpoints.hit("mid_poll")
    if job.task_observed_at and now - job.task_observed_at > timedelta(milliseconds=settings.JOB_PROCESSING_TIMEOUT_MS):
        return _time_out(job, token)
    try:
        request = resolved_job(job, provider)
        if turn is not None:
            turn()
        state = providers.call(request, adapter_for(provider.family).check, job.task_id, request)
    except Exception as error:
        return _check_failed(job, token, error, now=now)
    # Re-read before acting: the check took a while, and meanwhile the job may have been
    # finished by another cycle, cleared, or retried. Every write below is fenced as well.
    job = detached_job(job_id, token)
    if job is None:
        return Applied.SKIPPED
    if isinstance(state, Running):
        if _release_claim(job.id, token, family=provider.family, now=now, progress=state.progress, poll_failures=0):
            if state.progress is not None:
                events.broadcast_progress(job.project_id, job.id, state.progress)
            return Applied.RUNNING
        return Applied.SKIPPED
    if isinstance(state, Finished):
        return _hand_to_collector(job, token, now=now)
    if isinstance(state, Failed):
        return apply_failed(job, token, state, max_attempts=provider.max_attempts, attempt=OPEN)
    return Applied.UNKNOWN


def _time_out(job: Job, token) -> Applied:
    minutes = settings.JOB_PROCESSING_TIMEOUT_MS / 60000
    reason = (
        f"timed out: the provider reported no result within {minutes:g} minutes (task {job.task_id[:40]}); "
        "retrying checks the task again before submitting anew"
    )
    # The task id stays: a retry looks at the task first and collects it if it finished
    # late, instead of paying for a new one.
    failed = transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.TIMEOUT, attempt=OPEN)
    if failed:
        # Its slot is given away now: stop the task at the provider too, or it keeps
        # running (and billing) beside the job that takes the slot. After the commit,
        # best effort, like a user's cancel.
        remote_cancel.cancel_provider_task(job, provider_id=job.active_provider_id, task_id=job.task_id)
    return Applied.TIMEOUT if failed else Applied.SKIPPED


def _check_failed(job: Job, token, error: Exception, *, now) -> Applied:
    """A check that raised never fails the job by itself; the processing timeout does.
    An account problem pauses the provider; a run of refusals fails the job."""
    provider = job.active_provider
    reason = error.reason if isinstance(error, ProviderError) else type(error).__name__
    if isinstance(error, AccountError):
        # The key or the credit, not the task: the owner must act. The task is paid
        # for, so it keeps being checked (a fixed key collects it).
        pause_for_account(provider, reason)
    elif isinstance(error, PermanentError) and job.poll_failures + 1 >= POLL_REFUSALS_TO_FAIL:
        return _give_up_checking(job, token, reason)
    log.info("poll of job %s failed (%s); will poll again", job.id, reason)
    _release_claim(job.id, token, family=provider.family, now=now, poll_failures=F("poll_failures") + 1)
    return Applied.ERROR


def _hand_to_collector(job: Job, token, *, now) -> Applied:
    # Hold the claim while a worker collects; if that worker dies, the claim lapses
    # and a later cycle finds the task finished again. With the ORM broker the task
    # row commits together with the claim.
    with transaction.atomic():
        held = Job.objects.fenced(job.id, token).update(
            poll_claimed_until=now + timedelta(seconds=COLLECT_CLAIM_SECONDS), poll_failures=0
        )
        if not held:
            return Applied.SKIPPED
        enqueue.enqueue_collection(job.id, token)
    return Applied.FINISHED


def _give_up_checking(job: Job, token, reason: str) -> Applied:
    """The provider keeps refusing to report on the task (400/403/422, not a hiccup): fail
    the job readably instead of polling until the processing timeout. The task id goes:
    nothing can be learnt about it, so a retry submits anew."""
    reason = f"the provider refused {POLL_REFUSALS_TO_FAIL} status checks in a row for task {job.task_id[:40]}: {reason}"
    failed = transitions.job_fail(
        job.id, token, reason=reason, error_class=ErrorClass.PERMANENT, attempt=OPEN, keep_task_id=False
    )
    return Applied.FAILED if failed else Applied.SKIPPED
