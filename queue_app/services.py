"""Write services: everything pages, the API, admin, MCP and commands change goes
through here (`<entity>_<action>`, keyword-only arguments)."""

import hashlib
import json
import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from queue_app.engine import dispatch, events, outputs, remote_cancel, transitions
from queue_app.models import IdempotencyKey, Job, Project, Provider, Status

log = logging.getLogger(__name__)

MAX_DRAFTS_PER_REQUEST = 500
MAX_PROMPT_CHARS = 32000


class ServiceError(Exception):
    """A refusal with a message meant for the user; `code` maps to an HTTP status."""

    def __init__(self, message: str, code: int = 400):
        super().__init__(message)
        self.message = message
        self.code = code


# --- Drafts -----------------------------------------------------------------------------

DRAFT_FIELDS = ("model", "aspect_ratio", "quality", "resolution", "format", "background", "sound")


def jobs_create_drafts(
    *, user, project: Project, prompt: str, quantity: int = 1, provider: Provider | None = None, settings_: dict | None = None
) -> list[Job]:
    """Create `quantity` drafts of one prompt. Validates at the edge: a bad value is a
    ServiceError with a readable message, and nothing is created."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404)
    prompt = (prompt or "").strip()
    if not prompt:
        raise ServiceError("a prompt is required")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ServiceError(f"the prompt is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= MAX_DRAFTS_PER_REQUEST:
        raise ServiceError(f"quantity must be a whole number from 1 to {MAX_DRAFTS_PER_REQUEST}")
    if provider is not None and provider.owner_id != user.id:
        raise ServiceError("provider not found", 404)
    values = {}
    for key, value in (settings_ or {}).items():
        if key == "duration":
            if value in (None, ""):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 600:
                raise ServiceError("duration must be a whole number of seconds from 1 to 600")
            values["duration"] = value
        elif key in DRAFT_FIELDS:
            if value is None:
                continue
            if not isinstance(value, str) or len(value) > (200 if key == "model" else 30):
                raise ServiceError(f"{key} must be a short text value")
            values[key] = value.strip()
        elif key == "params":
            if not isinstance(value, dict):
                raise ServiceError("params must be an object")
            values["params"] = value
        elif key == "references":
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value) or len(value) > 16:
                raise ServiceError("references must be a list of at most 16 strings")
            values["references"] = value
        else:
            raise ServiceError(f"unknown setting {key!r}")
    jobs = [Job(project=project, owner=user, prompt=prompt, provider=provider, **values) for _ in range(quantity)]
    with transaction.atomic():
        Job.objects.bulk_create(jobs)
        events.emit_many(project.id, [("job.drafted", job.id, Status.DRAFT, {}) for job in jobs])
    return jobs


def drafts_delete(*, user, project: Project, job_ids) -> int:
    with transaction.atomic():
        ids = list(
            Job.objects.filter(project=project, owner=user, id__in=job_ids, status=Status.DRAFT).values_list("id", flat=True)
        )
        # delete() counts cascaded rows (attempts) too: count the jobs alone
        deleted = Job.objects.filter(id__in=ids, status=Status.DRAFT).delete()[1].get(Job._meta.label, 0)
        events.emit_many(project.id, [("job.deleted", job_id, "", {}) for job_id in ids])
    return deleted


# --- Starting and retrying --------------------------------------------------------------


def storage_check(*, user, starting: int) -> None:
    """Refuse when album usage plus 25 MB per pending job (all of the user's pending
    jobs, plus the ones about to start) would pass the user's storage limit."""
    if starting <= 0:
        return
    pending = Job.objects.filter(owner=user, status=Status.PENDING).count()
    needed = (pending + starting) * settings.JOB_STORAGE_ESTIMATE_BYTES
    used = outputs.usage_bytes(user.id)
    limit = outputs.storage_limit(user.id)
    if used + needed > limit:
        raise ServiceError(
            f"Storage limit exceeded. Cannot start generation. Remaining: {max(0, limit - used) / 1e6:.1f} MB. "
            f"Required: ~{needed / 1e6:.0f} MB for {pending + starting} pending job(s).",
            403,
        )


def jobs_start(*, user, project: Project, job_ids=None, all_drafts: bool = False) -> dict:
    """Start selected jobs (draft, or failed = retry) or all drafts of a project.

    Returns {"started": [ids], "skipped": n}. Pending and processing jobs are never
    duplicated; starting the same jobs twice is harmless.
    """
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404)
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
        rows = transitions.jobs_cancel(ids, by=f"user {user.pk}")
        # The remote calls go after the commit (a caller's outer transaction included):
        # never HTTP inside a transaction, and never for a cancel that rolled back. They
        # are bounded by the adapters' timeouts and never raise.
        transaction.on_commit(lambda: remote_cancel.cancel_tasks(rows))
    log.info("cancel by user %s: %d job(s)", user.pk, len(rows))
    return {"cancelled": len(rows), "skipped": len(job_ids) - len(rows)}


def failed_scope(*, user, project_id=None, provider_id=None):
    """Failed jobs a user may act on, in one scope: everything (staff: everyone's), a
    project, or a provider queue (the job's provider, or else its project's)."""
    if project_id is not None and provider_id is not None:
        raise ServiceError("choose one scope: a project or a provider, not both")
    jobs = Job.objects.filter(status=Status.FAILED)
    if not user.is_staff:
        jobs = jobs.filter(owner=user)
    if project_id is not None:
        if not Project.objects.filter(id=project_id, **({} if user.is_staff else {"owner": user})).exists():
            raise ServiceError("project not found", 404)
        jobs = jobs.filter(project_id=project_id)
    if provider_id is not None:
        if not Provider.objects.filter(id=provider_id, **({} if user.is_staff else {"owner": user})).exists():
            raise ServiceError("provider not found", 404)
        jobs = jobs.filter(Q(provider_id=provider_id) | Q(provider__isnull=True, project__provider_id=provider_id))
    return jobs


def failed_jobs_retry(*, user, project_id=None, provider_id=None) -> dict:
    ids = list(failed_scope(user=user, project_id=project_id, provider_id=provider_id).values_list("id", flat=True))
    started = transitions.jobs_to_pending(ids, from_statuses=(Status.FAILED,), kind="job.retried")
    log.info("retry failed by user %s: %d job(s) (project=%s provider=%s)", user.pk, len(started), project_id, provider_id)
    return {"retried": len(started)}


def failed_jobs_clear(*, user, project_id=None, provider_id=None) -> dict:
    """Delete failed job records in one scope. Album items survive (their job link is set
    to null); projects that still have pending work are woken."""
    scope = failed_scope(user=user, project_id=project_id, provider_id=provider_id)
    with transaction.atomic():
        rows = list(scope.select_for_update(of=("self",)).values_list("id", "project_id"))
        ids = [job_id for job_id, _ in rows]
        # Deleting with the status re-checked guards against a concurrent retry.
        # delete() counts cascaded rows (attempts) too: count the jobs alone
        cleared = Job.objects.filter(id__in=ids, status=Status.FAILED).delete()[1].get(Job._meta.label, 0)
        events.emit_grouped([(project_id_, "job.cleared", job_id, "", {}) for job_id, project_id_ in rows])
    projects = sorted({project_id_ for _, project_id_ in rows})
    resumed = list(
        Job.objects.filter(project_id__in=projects, status=Status.PENDING).values_list("project_id", flat=True).distinct()
    )
    if resumed:
        transaction.on_commit(lambda: dispatch.wake(project_ids=resumed))
    log.info("clear failed by user %s: %d job(s) (project=%s provider=%s)", user.pk, cleared, project_id, provider_id)
    return {"cleared": cleared, "resumed_projects": resumed}


# --- Providers --------------------------------------------------------------------------


def _own_provider(user, provider_id) -> Provider:
    provider = Provider.objects.filter(id=provider_id).first()
    if provider is None or (provider.owner_id != user.id and not user.is_staff):
        raise ServiceError("provider not found", 404)
    return provider


def provider_set_paused(*, user, provider_id, paused: bool) -> Provider:
    provider = _own_provider(user, provider_id)
    Provider.objects.filter(id=provider.id).update(paused=paused, paused_reason="")
    log.info("provider %s %s by user %s", provider.id, "paused" if paused else "resumed", user.pk)
    if not paused:
        transaction.on_commit(lambda: dispatch.wake(provider_ids={provider.id}))
    provider.paused = paused
    return provider


def provider_set_concurrency(*, user, provider_id, concurrency) -> Provider:
    """Takes effect at once for new dispatches. Lowering it never cancels running or
    detached work: the extra jobs finish and their slots are not refilled."""
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or not 1 <= concurrency <= 1000:
        raise ServiceError("concurrency must be a whole number from 1 to 1000")
    provider = _own_provider(user, provider_id)
    Provider.objects.filter(id=provider.id).update(concurrency=concurrency)
    log.info("provider %s concurrency %s → %s by user %s", provider.id, provider.concurrency, concurrency, user.pk)
    if concurrency > provider.concurrency:
        transaction.on_commit(lambda: dispatch.wake(provider_ids={provider.id}))
    provider.concurrency = concurrency
    return provider


def provider_clear_cooldown(*, user, provider_id) -> Provider:
    provider = _own_provider(user, provider_id)
    Provider.objects.filter(id=provider.id).update(cooldown_until=None)
    transaction.on_commit(lambda: dispatch.wake(provider_ids={provider.id}))
    return provider


# --- Idempotency ------------------------------------------------------------------------

IDEMPOTENCY_TTL = timedelta(hours=24)


class IdempotencyConflict(ServiceError):
    pass


def request_fingerprint(scope: str, body) -> str:
    return hashlib.sha256((scope + "\n" + json.dumps(body, sort_keys=True, default=str)).encode()).hexdigest()


def idempotent(*, user, key: str | None, scope: str, body, run):
    """Run `run()` -> (payload, status) once per (user, key).

    Same key and same request → the first response again; a different request → 422;
    the first request still running → 409. Keys are kept at least 24 hours.
    """
    if not key:
        return run()
    if len(key) > 200:
        raise ServiceError("Idempotency-Key is too long (200 characters at most)")
    fingerprint = request_fingerprint(scope, body)
    IdempotencyKey.objects.filter(owner=user, created_at__lt=timezone.now() - IDEMPOTENCY_TTL).delete()
    try:
        with transaction.atomic():
            record = IdempotencyKey.objects.create(owner=user, key=key, scope=scope, request_hash=fingerprint)
    except IntegrityError:
        existing = IdempotencyKey.objects.get(owner=user, key=key)
        if existing.request_hash != fingerprint:
            raise IdempotencyConflict("this Idempotency-Key was used with a different request", 422) from None
        if existing.status_code is None:
            raise IdempotencyConflict("a request with this Idempotency-Key is still in progress", 409) from None
        return existing.response, existing.status_code
    try:
        payload, status = run()
    except ServiceError as error:
        IdempotencyKey.objects.filter(id=record.id).delete()
        raise error
    except Exception:
        IdempotencyKey.objects.filter(id=record.id).delete()
        raise
    IdempotencyKey.objects.filter(id=record.id).update(response=payload, status_code=status)
    return payload, status


# --- Needs attention (issue 16): held ambiguous submissions (engine/ambiguous.py) ---


def _held(user, job_ids):
    from queue_app.models import ErrorClass

    jobs = Job.objects.filter(id__in=list(job_ids), status=Status.FAILED, error_class=ErrorClass.ATTENTION)
    return jobs if user.is_staff else jobs.filter(owner=user)


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
