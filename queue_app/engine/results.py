"""Applying what a provider reported for a job: finished outputs written through the
output writer (`collect_outputs`), or a remote task that ended without a result
(`apply_failed`). Shared by the worker (execute, collect) and the queue service's poller."""

import logging

from django.db import DatabaseError, transaction

from queue_app.engine import backoff, outputs, transitions
from queue_app.engine.attempts import attempt_finish, attempt_record
from queue_app.models import Job, JobAttempt, Provider
from queue_app.providers.base import Failed
from queue_app.providers.crypto import redact

log = logging.getLogger(__name__)


def detached_job(job_id, token) -> Job | None:
    """The job, if it is still the detached job we claimed."""
    return Job.objects.select_related("active_provider").fenced(job_id, token).exclude(task_id="").first()


def collect_outputs(job: Job, token, provider: Provider, attempt: JobAttempt, results: list) -> int | None:
    """Write finished outputs and complete the job; a local failure keeps the task id."""
    try:
        outputs.write_and_complete(job.id, token, results, attempt_id=attempt.id)
    except outputs.Fenced:
        attempt_finish(attempt.id, JobAttempt.Outcome.LOST, "job taken before its outputs were written")
        return None
    except outputs.QuotaExceeded as error:
        attempt_finish(attempt.id, JobAttempt.Outcome.LOCAL, str(error))
        transitions.job_fail(job.id, token, reason=str(error), error_class="local")
        return provider.id
    except DatabaseError:
        raise  # not the result's fault: the caller reconnects or leaves the job to healing
    except Exception as error:
        reason = redact(f"the provider finished but storing the result failed: {error}", (provider.api_key, provider.api_secret))
        log.warning("job %s: %s", job.id, reason)
        attempt_finish(attempt.id, JobAttempt.Outcome.LOCAL, reason)
        transitions.job_fail(job.id, token, reason=reason, error_class="local")
        return provider.id
    return provider.id


def apply_failed(job, token, provider, state: Failed, *, record: bool = True) -> str:
    """The remote task ended without a result. Permanent (or dead): the job fails and
    forgets the task id. Worth another try: back to pending, bounded by max attempts."""
    outcome = JobAttempt.Outcome.PERMANENT if state.permanent else JobAttempt.Outcome.TRANSIENT
    with transaction.atomic():
        if state.permanent:
            done = transitions.job_fail(job.id, token, reason=state.reason, error_class="permanent", keep_task_id=False)
            result = "failed"
        elif job.attempts >= provider.max_attempts:
            done = transitions.job_fail(
                job.id,
                token,
                reason=f"gave up after {job.attempts} attempts, last: {state.reason}",
                error_class="transient",
                keep_task_id=False,
            )
            result = "failed"
        else:
            done = transitions.job_requeue(
                job.id, token, reason=state.reason, error_class="transient", delay=backoff.delay(job.attempts)
            )
            result = "requeued"
        if not done:
            return "skipped"
        if record:
            attempt_record(job, outcome=outcome, reason=state.reason)
    return result
