"""Batch status checks: one list request reports on many detached tasks of a provider
record (a family with `check_page`, e.g. Replicate's predictions, 100 a page).

A batch is claimed set-based (one select of due ids, one update setting a fresh poll token
on those still due, so of two pollers only one gets each row, one read of what it got) and
applied the same way: the tasks the pages show running are released in one update; the
rest (finished, failed, unseen, past the processing timeout) go back for a single check.
Every page waits for a turn of the record's budget; a failed page releases the unseen
tasks for the next cadence without counting a failure against any of them."""

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db.models import Q

from queue_app import providers
from queue_app.engine import runner_registry
from queue_app.engine.clock import db_now
from queue_app.engine.provider_state import pause_for_account
from queue_app.engine.snapshot import resolved_job
from queue_app.models import Job, Status
from queue_app.providers import budget, poll_seconds
from queue_app.providers.base import AccountError, ProviderError

log = logging.getLogger(__name__)

# Pages read beyond those the claimed tasks fill: other predictions of the account (made
# elsewhere, or finished) sit between ours.
EXTRA_PAGES = 2
# At most this many tasks in one batch (one statement's parameters on SQLite included).
BATCH_CLAIM_LIMIT = 10_000


def due_jobs(now):
    """Detached jobs whose next check is due and that no poller or collector holds."""
    return (
        Job.objects.filter(status=Status.PROCESSING, next_poll_at__lte=now)
        .exclude(task_id="")
        .exclude(project__kind__in=runner_registry.kinds())
        .filter(Q(poll_claimed_until__isnull=True) | Q(poll_claimed_until__lt=now))
        # a collector at work holds a live lease: leave the job to it
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
    )


def claim_batch(provider_id: int, *, now, limit: int, claim_seconds: float) -> tuple[uuid.UUID, list]:
    """Claim up to `limit` due jobs of one provider record under one new poll token.
    Returns (token, claimed job ids)."""
    token = uuid.uuid4()
    limit = max(0, min(limit, BATCH_CLAIM_LIMIT))
    ids = list(due_jobs(now).filter(active_provider_id=provider_id).order_by("next_poll_at").values_list("id", flat=True)[:limit])
    if not ids:
        return token, []
    due_jobs(now).filter(id__in=ids).update(lease_token=token, poll_claimed_until=now + timedelta(seconds=claim_seconds))
    return token, list(Job.objects.filter(id__in=ids, lease_token=token).values_list("id", flat=True))


def check_batch(job_ids: list, token, *, adapter, spacing: budget.Spacing, turns: list, now=None) -> list:
    """Check claimed jobs through the family's list endpoint. Returns the ids left for a
    single check (finished, failed, unseen or timed out); the running ones are released
    for their next cadence here."""
    now = now or db_now()
    jobs = list(Job.objects.select_related("active_provider").filter(id__in=job_ids, lease_token=token, status=Status.PROCESSING))
    if not jobs:
        return []
    timeout = timedelta(milliseconds=settings.JOB_PROCESSING_TIMEOUT_MS)
    single = [job.id for job in jobs if job.task_observed_at and now - job.task_observed_at > timeout]
    by_task = {job.task_id: job.id for job in jobs if job.id not in set(single)}
    provider = jobs[0].active_provider
    request = resolved_job(jobs[0], provider)
    running: set = set()
    cursor, pages, failed = "", 0, False
    limit = -(-len(by_task) // budget.batch_size(provider.family, adapter=adapter)) + EXTRA_PAGES
    while by_task.keys() - running and pages < limit:
        spacing.wait_until(turns.pop(0)) if turns else spacing.take()
        pages += 1
        try:
            page, cursor = providers.call(request, adapter.check_page, cursor, request)
        except Exception as error:
            reason = error.reason if isinstance(error, ProviderError) else type(error).__name__
            log.info("status list of provider %s failed (%s); its tasks wait for the next cadence", provider.id, reason)
            if isinstance(error, AccountError):
                pause_for_account(provider, reason)
            failed = True
            break
        running.update(task for task in page if task in by_task)
        if not cursor:
            break
    _release(provider.family, [by_task[task] for task in running], token, now, poll_failures=0)
    left = [by_task[task] for task in by_task.keys() - running]
    if failed:
        # The list failed: it says nothing about any one task, so none counts a failure
        # and none is checked singly (a burst of single checks into a failing API).
        _release(provider.family, left, token, now)
        left = []
    return single + left


def _release(family: str, job_ids: list, token, now, **fields) -> int:
    if not job_ids:
        return 0
    return Job.objects.filter(id__in=job_ids, lease_token=token, status=Status.PROCESSING).update(
        next_poll_at=now + timedelta(seconds=poll_seconds(family)), poll_claimed_until=None, **fields
    )
