"""Who goes next, by hand: "run next" moves pending jobs to the front of their provider's
queue (engine/fair_share.py claims them before any other, within the provider's limit,
cool-down and each job's own backoff); "retry now" ends the retry backoff of jobs waiting
one out, chosen ones or all of a provider's."""

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from queue_app.engine import dispatch
from queue_app.models import Job, Status
from queue_app.services.providers import _own_provider

log = logging.getLogger(__name__)


def jobs_run_next(*, user, job_ids) -> dict:
    """Move the user's pending jobs to the front, in the order given (the first given is
    the first claimed). Other jobs are skipped. Returns {"moved": [ids], "skipped": n}."""
    job_ids = list(dict.fromkeys(map(str, job_ids)))
    pending = Job.objects.filter(id__in=job_ids, owner=user, status=Status.PENDING)
    found = {str(job_id): project_id for job_id, project_id in pending.values_list("id", "project_id")}
    moved = [job_id for job_id in job_ids if job_id in found]
    at = timezone.now()
    with transaction.atomic():
        for n, job_id in enumerate(moved):
            # A microsecond apart: the order given is the order claimed.
            Job.objects.filter(id=job_id, status=Status.PENDING).update(run_next_at=at + timedelta(microseconds=n))
        projects = set(found.values())
        transaction.on_commit(lambda: dispatch.wake(project_ids=projects))
    log.info("run next by user %s: %d job(s)", user.pk, len(moved))
    return {"moved": moved, "skipped": len(job_ids) - len(moved)}


def _retry_now(jobs) -> list:
    """Clear the retry backoff of these pending jobs (the database's clock decides which
    are still waiting one out) and wake their providers' dispatch. Returns their ids."""
    waiting = jobs.filter(status=Status.PENDING, not_before__gt=Now())
    with transaction.atomic():
        rows = list(waiting.values_list("id", "project_id"))
        Job.objects.filter(id__in=[job_id for job_id, _ in rows], status=Status.PENDING).update(not_before=None)
        projects = {project_id for _, project_id in rows}
        transaction.on_commit(lambda: dispatch.wake(project_ids=projects))
    return [str(job_id) for job_id, _ in rows]


def jobs_retry_now(*, user, job_ids) -> dict:
    """Jobs waiting out a retry backoff are dispatchable now (within the provider's limit
    and cool-down). Others are skipped. Returns {"retried_now": [ids], "skipped": n}."""
    job_ids = list(dict.fromkeys(map(str, job_ids)))
    done = _retry_now(Job.objects.filter(id__in=job_ids, owner=user))
    log.info("retry now by user %s: %d job(s)", user.pk, len(done))
    return {"retried_now": done, "skipped": len(job_ids) - len(done)}


def provider_retry_now(*, user, provider_id) -> dict:
    """Every job of this provider record's queue (its own, and its projects' that name no
    provider) waiting out a retry backoff, now. Returns {"retried_now": n}."""
    provider = _own_provider(user, provider_id)
    queue = Job.objects.filter(Q(provider_id=provider.id) | Q(provider__isnull=True, project__provider_id=provider.id))
    done = _retry_now(queue.filter(owner=user))
    log.info("retry now of provider %s by user %s: %d job(s)", provider.id, user.pk, len(done))
    return {"retried_now": len(done)}
