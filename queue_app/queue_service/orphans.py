"""Orphans: a task an attempt's submission created at the provider whose id was never
stored, left behind by a job that will not look it up again — it completed by another
task, was cancelled, or failed. Such a task runs (and bills) for nobody. A job that is
still waiting adopts its own when its next attempt starts (engine/reconcile.py); for the
others, this sweep of the queue service looks the task up by the attempt's tag (families
with a lookup) and cancels it at the provider. The attempt row then names the task, so it
is never looked up or adopted again.
"""

import logging
from datetime import timedelta

from django.utils import timezone

from queue_app import providers
from queue_app.engine import reconcile
from queue_app.engine.attempts import attempt_orphan_settled
from queue_app.engine.snapshot import resolved_job
from queue_app.models import JobAttempt, Provider, Status
from queue_app.providers.base import ProviderError

log = logging.getLogger(__name__)

# A submit cancelled while its worker was inside the create call (or dead after it) may
# have left a task too: a live worker cancels its own, a dead one's is found here.
LEFT_BEHIND = (*reconcile.MAY_HAVE_REACHED, JobAttempt.Outcome.CANCELLED)

SWEEP_SECONDS = 15  # how often the queue service looks (a step of its loop)
WINDOW = timedelta(minutes=15)  # attempts that ended longer ago are not looked up again
BATCH = 5  # lookups per sweep: each is a provider request on the service's own loop


def unsettled_of_ended_jobs(now=None) -> list[JobAttempt]:
    """Attempts that may have left a task behind, of jobs that will not adopt it."""
    since = (now or timezone.now()) - WINDOW
    rows = JobAttempt.objects.filter(
        phase=JobAttempt.Phase.SUBMIT,
        outcome__in=LEFT_BEHIND,
        task_id="",
        finished_at__gte=since,
        job__status__in=(Status.COMPLETED, Status.FAILED),
    )
    return list(rows.select_related("job").order_by("finished_at")[:BATCH])


def sweep_in_thread() -> None:
    """One sweep on a thread of its own: its provider requests must never hold up the
    service's loop (healing, dispatch), however long a provider takes to answer."""
    from django.db import connection

    try:
        sweep()
    except Exception:
        log.exception("orphan sweep failed")
    finally:
        connection.close()


def sweep(now=None) -> int:
    """Cancel the orphans found; returns how many were cancelled."""
    cancelled = 0
    for attempt in unsettled_of_ended_jobs(now):
        provider = Provider.objects.filter(id=attempt.provider_id).first()
        adapter = _adapter(provider)
        if adapter is None:
            continue
        request = resolved_job(attempt.job, provider)
        tag = reconcile.tag(attempt.job_id, attempt.number)
        try:
            found = providers.call(request, adapter.find_submitted, request, tag, attempt.started_at - reconcile.CLOCK_MARGIN)
        except ProviderError as error:
            log.info("orphan lookup for job %s failed: %s", attempt.job_id, error.reason)
            continue
        for task_id in reconcile.unheld(found):
            cancelled += _cancel(adapter, request, attempt, task_id)
    return cancelled


def _adapter(provider: Provider | None):
    if provider is None:
        return None
    try:
        adapter = providers.adapter_for(provider.family)
    except ProviderError:
        return None
    return adapter if callable(getattr(adapter, "find_submitted", None)) else None


def _cancel(adapter, request, attempt: JobAttempt, task_id: str) -> int:
    cancel = getattr(adapter, "cancel", None)
    done = False
    if callable(cancel):
        try:
            providers.call(request, cancel, task_id, request)
            done = True
        except ProviderError as error:
            log.info("cancelling orphan %s of job %s failed: %s", task_id, attempt.job_id, error.reason)
            return 0
    note = "cancelled at the provider" if done else "the provider offers no cancel"
    attempt_orphan_settled(attempt.id, task_id=task_id, note=f"orphan task {task_id} found after the job ended; {note}")
    log.info("job %s: orphan task %s of attempt %s: %s", attempt.job_id, task_id, attempt.number, note)
    return int(done)
