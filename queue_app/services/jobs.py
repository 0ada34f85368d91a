"""Job actions: start, retry, cancel, clear failed ones, and the held-for-attention choices."""

import logging

from django.db import transaction
from django.db.models import Q

from queue_app.engine import attempt_tally, dispatch, events, remote_cancel, transitions
from queue_app.models import Job, Project, Provider, Status
from queue_app.selectors.visibility import actable_to, visible_to
from queue_app.services.acting import JOBS, acting_on
from queue_app.services.errors import ServiceError
from queue_app.services.storage import storage_check

log = logging.getLogger(__name__)


def jobs_start(*, user, project: Project, job_ids=None, all_drafts: bool = False) -> dict:
    """Start selected jobs (draft, or failed = retry) or all drafts of a project.

    Returns {"started": [ids], "skipped": n}. Pending and processing jobs are never
    duplicated; starting the same jobs twice is harmless.
    """
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404, field="project_id")
    if all_drafts:
        if job_ids:
            raise ServiceError("give job ids or all_drafts, not both")
        candidates = Job.objects.filter(project=project, status=Status.DRAFT)
        from_statuses = (Status.DRAFT,)
    else:
        if not job_ids:
            raise ServiceError("no jobs selected")
        job_ids = list(job_ids)
        found = Job.objects.filter(id__in=job_ids)
        if found.exclude(project=project).exists() or found.count() != len(set(map(str, job_ids))):
            raise ServiceError("some jobs do not belong to this project", 404)
        candidates = found.filter(status__in=(Status.DRAFT, Status.FAILED))
        from_statuses = (Status.DRAFT, Status.FAILED)
    ids = list(candidates.values_list("id", flat=True))
    storage_check(user=user, starting=len(ids))
    started = transitions.jobs_to_pending(ids, from_statuses=from_statuses)
    return {"started": [str(i) for i in started], "skipped": (len(job_ids) if job_ids else len(ids)) - len(started)}


def jobs_retry(*, user, job_ids) -> dict:
    """Failed jobs back to pending (across projects). A job that keeps its remote task id
    is collected rather than paid for again."""
    jobs = Job.objects.filter(id__in=list(job_ids), owner=user, status=Status.FAILED)
    ids = list(jobs.values_list("id", flat=True))
    storage_check(user=user, starting=len(ids))
    started = transitions.jobs_to_pending(ids, from_statuses=(Status.FAILED,), kind="job.retried")
    return {"retried": [str(i) for i in started]}


def jobs_cancel(*, user, job_ids) -> dict:
    """Cancel the user's pending and processing jobs: each fails at once with reason
    "cancelled" (a running worker's result is fenced out, the slot is free now), then its
    remote task is cancelled at the provider where the API can — after the commit, best
    effort. Drafts, finished and other users' jobs are skipped.
    Returns {"cancelled": n, "skipped": m}."""
    job_ids = list(dict.fromkeys(map(str, job_ids)))
    ids = list(Job.objects.filter(id__in=job_ids, owner=user).values_list("id", flat=True))
    with transaction.atomic():
        rows = transitions.jobs_cancel(ids, by=f"user {user.get_username()}")
        # The remote calls go after the commit (a caller's outer transaction included):
        # never HTTP inside a transaction, and never for a cancel that rolled back. They
        # are bounded by the adapters' timeouts and never raise.
        transaction.on_commit(lambda: remote_cancel.cancel_tasks(rows))
    log.info("cancel by user %s: %d job(s)", user.pk, len(rows))
    return {"cancelled": len(rows), "skipped": len(job_ids) - len(rows)}


def failed_scope(*, user, project_id=None, provider_id=None):
    """Failed jobs a user may act on, in one scope: everything (their own; everyone's with
    the jobs permission), a project, or a provider queue (the job's provider, or else its
    project's). A project or provider they may only see is refused (403), not emptied."""
    if project_id is not None and provider_id is not None:
        raise ServiceError("choose one scope: a project or a provider, not both")
    jobs = actable_to(user, Job).filter(status=Status.FAILED)
    if project_id is not None:
        project = visible_to(user, Project).filter(id=project_id).first()
        if project is None:
            raise ServiceError("project not found", 404, field="project_id")
        acting_on(user, project, noun="project", permission=JOBS)
        jobs = jobs.filter(project_id=project_id)
    if provider_id is not None:
        provider = visible_to(user, Provider).filter(id=provider_id).first()
        if provider is None:
            raise ServiceError("provider not found", 404, field="provider_id")
        acting_on(user, provider, noun="provider", permission=JOBS)
        jobs = jobs.filter(Q(provider_id=provider_id) | Q(provider__isnull=True, project__provider_id=provider_id))
    return jobs


def failed_jobs_retry(*, user, project_id=None, provider_id=None) -> dict:
    ids = list(failed_scope(user=user, project_id=project_id, provider_id=provider_id).values_list("id", flat=True))
    started = transitions.jobs_to_pending(ids, from_statuses=(Status.FAILED,), kind="job.retried")
    log.info("retry failed by user %s: %d job(s) (project=%s provider=%s)", user.pk, len(started), project_id, provider_id)
    return {"retried": len(started)}


def _clear_failed(jobs) -> tuple[int, list]:
    """Delete these failed jobs (album items survive: their job link is set to null) and
    wake the projects that still have pending work. Returns (jobs deleted, woken projects)."""
    with transaction.atomic():
        rows = list(jobs.select_for_update(of=("self",)).values_list("id", "project_id"))
        ids = [job_id for job_id, _ in rows]
        # Deleting with the status re-checked guards against a concurrent retry.
        # delete() counts cascaded rows (attempts) too: count the jobs alone
        doomed = Job.objects.filter(id__in=ids, status=Status.FAILED)
        attempt_tally.fold_jobs(doomed.values_list("id", flat=True))  # the counters keep them
        cleared = doomed.delete()[1].get(Job._meta.label, 0)
        events.emit_grouped([(project_id, "job.cleared", job_id, "", {}) for job_id, project_id in rows])
    projects = sorted({project_id for _, project_id in rows})
    resumed = list(
        Job.objects.filter(project_id__in=projects, status=Status.PENDING).values_list("project_id", flat=True).distinct()
    )
    if resumed:
        transaction.on_commit(lambda: dispatch.wake(project_ids=resumed))
    return cleared, resumed


def failed_jobs_clear(*, user, project_id=None, provider_id=None) -> dict:
    """Delete failed job records in one scope. Album items survive (their job link is set
    to null); projects that still have pending work are woken."""
    cleared, resumed = _clear_failed(failed_scope(user=user, project_id=project_id, provider_id=provider_id))
    log.info("clear failed by user %s: %d job(s) (project=%s provider=%s)", user.pk, cleared, project_id, provider_id)
    return {"cleared": cleared, "resumed_projects": resumed}


def selected_failed_retry(*, user, job_ids) -> dict:
    """The failed jobs among `job_ids` that the user may act on (their own; anyone's with
    the jobs permission) back to pending; the others are skipped."""
    job_ids = list(job_ids)
    ids = list(failed_scope(user=user).filter(id__in=job_ids).values_list("id", flat=True))
    started = transitions.jobs_to_pending(ids, from_statuses=(Status.FAILED,), kind="job.retried")
    log.info("retry selected by user %s: %d of %d job(s)", user.pk, len(started), len(job_ids))
    return {"retried": len(started), "skipped": len(job_ids) - len(started)}


def selected_failed_clear(*, user, job_ids) -> dict:
    """Delete the failed jobs among `job_ids` that the user may act on, as
    failed_jobs_clear does for a scope; the others are skipped."""
    job_ids = list(job_ids)
    cleared, _ = _clear_failed(failed_scope(user=user).filter(id__in=job_ids))
    log.info("clear selected by user %s: %d of %d job(s)", user.pk, cleared, len(job_ids))
    return {"cleared": cleared, "skipped": len(job_ids) - cleared}


def _held(user, job_ids):
    from queue_app.models import ErrorClass

    return actable_to(user, Job).filter(id__in=list(job_ids), status=Status.FAILED, error_class=ErrorClass.ATTENTION)


def attention_resubmit(*, user, job_ids) -> dict:
    """A person checked the provider and found nothing was accepted (or wants it again
    anyway): the held jobs go back to pending and are submitted anew."""
    ids = list(_held(user, job_ids).values_list("id", flat=True))
    storage_check(user=user, starting=len(ids))
    started = transitions.jobs_to_pending(ids, from_statuses=(Status.FAILED,), kind="job.retried")
    log.info("needs attention: user %s resubmitted %d job(s)", user.pk, len(started))
    return {"resubmitted": [str(i) for i in started]}


def attention_mark_failed(*, user, job_ids) -> dict:
    """The held jobs become ordinary failures (error class "ambiguous"), off the list."""
    from queue_app.models import ErrorClass

    marked = _held(user, job_ids).update(error_class=ErrorClass.AMBIGUOUS)
    log.info("needs attention: user %s marked %d job(s) failed", user.pk, marked)
    return {"marked_failed": marked}
