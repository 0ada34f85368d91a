"""Applying what a provider (or ComfyUI) reported for a job, shared by the worker
(execute, collect), the queue service's poller and the ComfyUI collector: outputs go
through the output writer (`store_outputs`), a failed remote task fails or requeues the
job (`apply_failed`, `retry_or_give_up`). Each takes the attempt the outcome ends: a
worker's attempt id, or attempts.OPEN for a check's finding.
"""

import logging
from enum import StrEnum

from django.db import DatabaseError

from queue_app.engine import backoff, outputs, transitions
from queue_app.models import ErrorClass, Job
from queue_app.providers.base import Failed
from queue_app.providers.crypto import redact

log = logging.getLogger(__name__)


class Applied(StrEnum):
    """What applying a result (or a check of a remote task) did to the job."""

    SKIPPED = "skipped"  # the job was no longer ours: nothing written
    RUNNING = "running"  # the remote task is still at work
    FINISHED = "finished"  # handed to a collector
    COMPLETED = "completed"  # outputs stored, job completed
    FAILED = "failed"
    REQUEUED = "requeued"  # back to pending, to be tried again after a backoff
    TIMEOUT = "timeout"  # failed: no result within the processing timeout
    ERROR = "error"  # the check failed; the job is checked again later
    UNKNOWN = "unknown"  # an answer no adapter should give


def detached_job(job_id, token) -> Job | None:
    """The job, if it is still the detached job we claimed."""
    return Job.objects.select_related("active_provider").fenced(job_id, token).exclude(task_id="").first()


def store_outputs(
    job_id,
    token,
    attempt_id,
    results: list,
    *,
    source: str = "the provider",
    secrets=(),
    retry_hint: str = "",
    disk_full_waits: bool = False,
    handover=None,
    job: Job | None = None,
    cost=None,
) -> Applied:
    """Write finished outputs and complete the job, closing the attempt `attempt_id` in the
    same commit. COMPLETED, SKIPPED (the job was taken from us: nothing written) or FAILED
    (quota, or the result could not be fetched or written: the job fails and keeps its task
    id; `retry_hint` tells the user a retry collects the result again). A database error is
    raised: it is not the result's fault, and the caller reconnects or leaves the job to
    healing. With `disk_full_waits`, a full media disk sends the job back to pending with
    its task id (`wait_for_space`) instead of failing it. A `handover` (dispatch.Handover)
    claims the provider's next job in the completion's commit."""
    try:
        outputs.write_and_complete(job_id, token, results, attempt_id=attempt_id, handover=handover, job=job, cost=cost)
    except outputs.Fenced:
        transitions.job_lost(attempt_id, reason="job taken before its outputs were written")
        return Applied.SKIPPED
    except DatabaseError:
        raise
    except Exception as error:
        if disk_full_waits and isinstance(error, outputs.DiskFull):
            return wait_for_space(job_id, token, reason=str(error), attempt=attempt_id)
        if isinstance(error, (outputs.QuotaExceeded, outputs.DiskFull)):
            reason = str(error)
        else:
            reason = redact(f"{source} finished but storing the result failed: {error}", secrets)
            log.warning("job %s: %s", job_id, reason)
        reason = f"{reason}. {retry_hint}" if retry_hint else reason
        transitions.job_fail(job_id, token, reason=reason, error_class=ErrorClass.LOCAL, attempt=attempt_id)
        return Applied.FAILED
    return Applied.COMPLETED


def wait_for_space(job_id, token, *, reason: str, attempt) -> Applied:
    """The media disk is full: nothing is wrong with the result, so the job waits (back to
    pending after a backoff) and keeps its remote task id, so the next try collects the
    result it already paid for. Each wait costs one of its tries: a disk that stays full
    fails the job with the reason, and a retry then collects the result."""
    job = Job.objects.fenced(job_id, token).select_related("active_provider").first()
    if job is None:
        return Applied.SKIPPED
    max_attempts = job.active_provider.max_attempts if job.active_provider else 1
    if job.attempts >= max_attempts:
        reason = backoff.give_up_reason(job.attempts, reason)
        done = transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.LOCAL, attempt=attempt)
        return Applied.FAILED if done else Applied.SKIPPED
    done = transitions.job_requeue(
        job.id,
        token,
        reason=reason,
        error_class=ErrorClass.LOCAL,
        attempt=attempt,
        delay=backoff.delay(job.attempts),
        keep_task_id=True,
    )
    return Applied.REQUEUED if done else Applied.SKIPPED


def retry_or_give_up(
    job: Job, token, *, max_attempts: int, reason: str, error_class: ErrorClass, attempt, outcome=None, keep_task_id=True
) -> Applied:
    """A failure worth another try: back to pending after a backoff, or — the job's tries
    used up — failed with the give-up reason (keeping the task id unless told not to)."""
    ending = dict(error_class=error_class, attempt=attempt, outcome=outcome)
    if job.attempts >= max_attempts:
        reason = backoff.give_up_reason(job.attempts, reason)
        done = transitions.job_fail(job.id, token, reason=reason, keep_task_id=keep_task_id, **ending)
        return Applied.FAILED if done else Applied.SKIPPED
    done = transitions.job_requeue(job.id, token, reason=reason, delay=backoff.delay(job.attempts), **ending)
    return Applied.REQUEUED if done else Applied.SKIPPED


def apply_failed(job: Job, token, state: Failed, *, max_attempts: int, attempt) -> Applied:
    """The remote task ended without a result. Permanent (or dead): the job fails and
    forgets the task id. Worth another try: back to pending, bounded by max attempts."""
    if state.permanent:
        done = transitions.job_fail(
            job.id, token, reason=state.reason, error_class=ErrorClass.PERMANENT, attempt=attempt, keep_task_id=False
        )
        return Applied.FAILED if done else Applied.SKIPPED
    return retry_or_give_up(
        job,
        token,
        max_attempts=max_attempts,
        reason=state.reason,
        error_class=ErrorClass.TRANSIENT,
        attempt=attempt,
        keep_task_id=False,
    )
