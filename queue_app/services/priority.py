"""Who goes next, by hand: "run next" moves pending jobs to the front of their provider's
queue (engine/fair_share.py claims them before any other, within the provider's limit,
cool-down and each job's own backoff)."""

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from queue_app.engine import dispatch
from queue_app.models import Job, Status

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
