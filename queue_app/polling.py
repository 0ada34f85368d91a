"""Detached polling: checking remote tasks until they finish.

One poll cycle (`poll_once`):
1. claim due detached jobs by `next_poll_at` with a short compare-and-set (a new poll
   token and `poll_claimed_until`), so two cycles or two machines never check one job
   at once;
2. run the HTTP checks outside any transaction on a bounded thread pool — a slow
   provider occupies its own checks, not the others';
3. every check re-reads the job first and applies its result with a fenced
   compare-and-set: a job another cycle finished, or a user cleared or retried, is
   left alone.
A finished task is handed to a worker (`collect`), which fetches a fresh result (signed
URLs expire) and writes it through the output writer. Poll errors never fail a job;
the processing timeout does.
"""

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import F, Q
from django.utils import timezone

from queue_app import backoff, events, execution, failpoints, tasks, transitions
from queue_app.models import Job, JobAttempt, Kind, Status
from queue_app.providers import adapter_for
from queue_app.providers.base import Failed, Finished, ProviderError, Running
from queue_app.snapshot import resolved_job

log = logging.getLogger(__name__)

POLL_CLAIM_SECONDS = 120
COLLECT_CLAIM_SECONDS = 1800


def poll_seconds(family: str) -> float:
    try:
        return float(getattr(adapter_for(family), "POLL_SECONDS", settings.DETACHED_POLL_SECONDS))
    except ProviderError:
        return settings.DETACHED_POLL_SECONDS


def claim_due(*, now=None, families=None, limit: int = 500) -> list[tuple]:
    """Claim detached jobs whose next poll is due. Returns [(job_id, poll_token)]."""
    now = now or timezone.now()
    due = (
        Job.objects.filter(status=Status.PROCESSING, next_poll_at__lte=now)
        .exclude(task_id="")
        .exclude(project__kind=Kind.COMFYUI)
        .filter(Q(poll_claimed_until__isnull=True) | Q(poll_claimed_until__lt=now))
    )
    if families:
        due = due.filter(active_provider__family__in=families)
    claimed = []
    for job_id, old_token, next_poll_at in due.order_by("next_poll_at").values_list("id", "lease_token", "next_poll_at")[:limit]:
        token = uuid.uuid4()
        if Job.objects.filter(id=job_id, status=Status.PROCESSING, lease_token=old_token, next_poll_at=next_poll_at).update(
            lease_token=token, poll_claimed_until=now + timedelta(seconds=POLL_CLAIM_SECONDS)
        ):
            claimed.append((job_id, token))
    return claimed


def poll_once(*, now=None, families=None, parallelism: int | None = None) -> int:
    """One cycle: claim what is due and check it. Returns how many jobs were checked."""
    claimed = claim_due(now=now, families=families)
    if not claimed:
        return 0
    workers = max(1, min(parallelism or settings.POLL_PARALLELISM, len(claimed)))
    if workers == 1:
        for job_id, token in claimed:
            check_job(job_id, token, now=now)
        return len(claimed)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="poll") as pool:
        list(pool.map(lambda item: _check_in_thread(*item, now=now), claimed))
    return len(claimed)


def _check_in_thread(job_id, token, *, now=None):
    try:
        return check_job(job_id, token, now=now)
    except Exception:
        log.exception("poll of job %s failed", job_id)
    finally:
        connection.close()


def _fenced(job_id, token):
    return Job.objects.filter(id=job_id, lease_token=token, status=Status.PROCESSING)


def _release_claim(job_id, token, *, family: str, now, **fields) -> bool:
    return bool(
        _fenced(job_id, token).update(
            next_poll_at=now + timedelta(seconds=poll_seconds(family)), poll_claimed_until=None, **fields
        )
    )


def check_job(job_id, token, *, now=None) -> str:
    """Check one claimed detached job and apply the result. Returns what happened."""
    now = now or timezone.now()
    job = Job.objects.select_related("active_provider").filter(id=job_id).first()
    if job is None or job.status != Status.PROCESSING or job.lease_token != token or not job.task_id:
        return "skipped"
    provider = job.active_provider
    failpoints.hit("mid_poll")
    timeout = timedelta(milliseconds=settings.JOB_PROCESSING_TIMEOUT_MS)
    if job.task_observed_at and now - job.task_observed_at > timeout:
        minutes = settings.JOB_PROCESSING_TIMEOUT_MS / 60000
        transitions.job_fail(
            job.id,
            token,
            reason=f"timed out: the provider reported no result within {minutes:g} minutes (task {job.task_id[:40]})",
            error_class="timeout",
        )
        return "timeout"
    try:
        state = adapter_for(provider.family).check(job.task_id, resolved_job(job, provider))
    except Exception as error:  # network, 5xx, bad JSON: never a job failure
        reason = error.reason if isinstance(error, ProviderError) else type(error).__name__
        log.info("poll of job %s failed (%s); will poll again", job.id, reason)
        _release_claim(job.id, token, family=provider.family, now=now, poll_failures=F("poll_failures") + 1)
        return "error"
    if isinstance(state, Running):
        if _release_claim(job.id, token, family=provider.family, now=now, progress=state.progress, poll_failures=0):
            if state.progress is not None:
                events.broadcast_progress(job.project_id, job.id, state.progress)
        return "running"
    if isinstance(state, Finished):
        # Hold the claim while a worker collects; if that worker dies, the claim lapses
        # and the next cycle finds the task finished again.
        if _fenced(job.id, token).update(poll_claimed_until=now + timedelta(seconds=COLLECT_CLAIM_SECONDS)):
            tasks.enqueue_collection(job.id, token)
        return "finished"
    if isinstance(state, Failed):
        return _apply_failed(job, token, provider, state)
    return "unknown"


def _apply_failed(job, token, provider, state: Failed) -> str:
    JobAttempt.objects.create(
        job=job,
        number=job.attempts,
        worker="poller",
        task_id=job.task_id,
        finished_at=timezone.now(),
        outcome=JobAttempt.Outcome.PERMANENT if state.permanent else JobAttempt.Outcome.TRANSIENT,
        reason=state.reason[:2000],
    )
    if state.permanent:
        transitions.job_fail(job.id, token, reason=state.reason, error_class="permanent", keep_task_id=False)
        return "failed"
    if job.attempts >= provider.max_attempts:
        transitions.job_fail(
            job.id,
            token,
            reason=f"gave up after {job.attempts} attempts, last: {state.reason}",
            error_class="transient",
            keep_task_id=False,
        )
        return "failed"
    transitions.job_requeue(job.id, token, reason=state.reason, error_class="transient", delay=backoff.delay(job.attempts))
    return "requeued"


def collect(job_id, token) -> None:
    """Worker side of a finished remote task: fetch the result and store it."""
    close_old_connections()
    job = Job.objects.select_related("active_provider").filter(id=job_id).first()
    if job is None or job.status != Status.PROCESSING or str(job.lease_token) != str(token) or not job.task_id:
        return
    provider = job.active_provider
    attempt = JobAttempt.objects.create(job=job, number=job.attempts, worker="collector", task_id=job.task_id)
    try:
        state = adapter_for(provider.family).check(job.task_id, resolved_job(job, provider))
    except Exception as error:
        reason = error.reason if isinstance(error, ProviderError) else type(error).__name__
        execution._attempt_finish(attempt.id, JobAttempt.Outcome.TRANSIENT, f"collect check failed: {reason}")
        _fenced(job.id, token).update(poll_claimed_until=None, next_poll_at=timezone.now())
        return
    if isinstance(state, Finished):
        execution.collect_outputs(job, token, provider, attempt, state.outputs)
    elif isinstance(state, Failed):
        execution._attempt_finish(attempt.id, JobAttempt.Outcome.PERMANENT, state.reason)
        _apply_failed(job, token, provider, state)
    else:
        execution._attempt_finish(attempt.id, JobAttempt.Outcome.DETACHED, "still running")
        _fenced(job.id, token).update(poll_claimed_until=None, next_poll_at=timezone.now())
