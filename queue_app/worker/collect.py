"""Collecting a finished remote task in a worker.

The queue service's poller found the task finished and handed it over (`collect_job`).
The worker re-reads the task for fresh (signed, expiring) output URLs and stores the
outputs through the output writer, the same one as the synchronous path; completion
frees the slot and wakes dispatch. A check that fails, or a task that runs again, goes
back to the poller.
"""

from django.db import close_old_connections

from queue_app import providers
from queue_app.engine import ledger, transitions
from queue_app.engine.attempts import attempt_collect
from queue_app.engine.leases import LeaseKeeper, reconnecting_once
from queue_app.engine.results import Applied, apply_failed, detached_job, store_outputs
from queue_app.engine.snapshot import resolved_job
from queue_app.providers import adapter_for
from queue_app.providers.base import Failed, Finished, ProviderError


def collect_task(job_id, token) -> Applied:
    """Worker side of a finished remote task: re-read it (fresh output URLs) and store the
    outputs through the output writer, which completes the job and frees its slot. The
    job's attempt goes on in its collect phase."""
    close_old_connections()
    job = detached_job(job_id, token)
    if job is None:
        return Applied.SKIPPED
    # The collector holds a renewed lease while it downloads: if it dies, the lease lapses
    # and healing hands the job back to the poller (which finds the task finished again).
    attempt = attempt_collect(job, token)
    if attempt is None:
        return Applied.SKIPPED
    provider = job.active_provider
    with LeaseKeeper(job.id, token):
        try:
            request = resolved_job(job, provider)
            state = providers.call(request, adapter_for(provider.family).check, job.task_id, request)
        except Exception as error:
            reason = error.reason if isinstance(error, ProviderError) else type(error).__name__
            return _back_to_polling(job.id, token, f"collect check failed: {reason}")
        if isinstance(state, Finished):
            secrets = (provider.api_key, provider.api_secret)
            cost = ledger.reported(provider, job.resolved, state.usage)
            return reconnecting_once(
                job.id,
                lambda: store_outputs(job.id, token, attempt.id, state.outputs, secrets=secrets, disk_full_waits=True, cost=cost),
            )
        if isinstance(state, Failed):
            return apply_failed(job, token, state, max_attempts=provider.max_attempts, attempt=attempt.id)
        return _back_to_polling(job.id, token, "still running")


def _back_to_polling(job_id, token, reason: str) -> Applied:
    """The task is not ready to collect after all: the poller checks it again now."""
    return Applied.RUNNING if transitions.job_back_to_polling(job_id, token, reason=reason) else Applied.SKIPPED
