"""Write services: everything pages, the API, admin, MCP and commands change goes
through here (`<entity>_<action>`, keyword-only arguments)."""

import hashlib
import json
import logging
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from queue_app import limits, references, selectors
from queue_app.engine import dispatch, events, outputs, remote_cancel, transitions
from queue_app.models import IdempotencyKey, Job, Kind, Project, Provider, Reference, Status
from queue_app.providers.catalogue import CATALOGUE, default_model

log = logging.getLogger(__name__)

MAX_DRAFTS_PER_REQUEST = limits.QUANTITY.high
MAX_PROMPT_CHARS = limits.PROMPT_CHARS
MIB = 1024 * 1024  # storage is shown in MB of 2^20 bytes, as JOB_STORAGE_ESTIMATE_BYTES counts them


class ServiceError(Exception):
    """A refusal with a message meant for the user; `code` maps to an HTTP status."""

    def __init__(self, message: str, code: int = 400):
        super().__init__(message)
        self.message = message
        self.code = code


def within_limits(check, value) -> None:
    """Run one of queue_app.limits' checks; its refusal becomes a ServiceError."""
    try:
        check(value)
    except ValidationError as error:
        raise ServiceError(" ".join(error.messages)) from None


# --- Drafts -----------------------------------------------------------------------------

DRAFT_FIELDS = ("model", "aspect_ratio", "quality", "resolution", "format", "background", "sound")


def jobs_create_drafts(
    *,
    user,
    project: Project,
    prompt: str,
    quantity: int = 1,
    provider: Provider | None = None,
    settings_: dict | None = None,
    per_line: bool = False,
) -> list[Job]:
    """Create `quantity` drafts of one prompt — or, `per_line`, of each non-blank line of
    it. Validates at the edge: a bad value is a ServiceError with a readable message, and
    nothing is created."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404)
    prompt = (prompt or "").strip()
    if not prompt:
        raise ServiceError("a prompt is required")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ServiceError(f"the prompt is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    if "\x00" in prompt:  # PostgreSQL cannot store it: a clear error, not a 500
        raise ServiceError("the prompt contains a NUL character (\\x00), which cannot be stored")
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= MAX_DRAFTS_PER_REQUEST:
        raise ServiceError(f"quantity must be a whole number from 1 to {MAX_DRAFTS_PER_REQUEST}")
    prompts = [line.strip() for line in prompt.splitlines() if line.strip()] if per_line else [prompt]
    if len(prompts) * quantity > MAX_DRAFTS_PER_REQUEST:
        raise ServiceError(
            f"{len(prompts)} line(s) × quantity {quantity} = {len(prompts) * quantity} drafts; "
            f"one request makes at most {MAX_DRAFTS_PER_REQUEST}"
        )
    draft_provider_check(user=user, project=project, provider=provider)
    values = draft_values(user=user, settings_=settings_)
    draft_default_model(project=project, provider=provider, values=values)
    jobs = [
        Job(project=project, owner=user, prompt=text, provider=provider, **values) for text in prompts for _ in range(quantity)
    ]
    with transaction.atomic():
        Job.objects.bulk_create(jobs)
        events.emit_many(project.id, [("job.drafted", job.id, Status.DRAFT, {}) for job in jobs])
    return jobs


def draft_provider_check(*, user, project: Project, provider: Provider | None) -> None:
    """A draft's own provider must be the user's and of a family that makes the project's
    kind (None: the project's provider, resolved at claim)."""
    if provider is None:
        return
    if provider.owner_id != user.id:
        raise ServiceError("provider not found", 404)
    if project.kind == Kind.COMFYUI:
        raise ServiceError("a ComfyUI project runs on its own instance; its drafts take no provider")
    if not any(spec.kind == project.kind for spec in CATALOGUE.get(provider.family, {}).values()):
        raise ServiceError(f"provider {provider.name!r} ({provider.family}) does not make {project.kind} outputs")


def draft_default_model(*, project: Project, provider: Provider | None, values: dict) -> None:
    """A draft on another provider family than its project's, with no model, gets that
    family's default model (the project's model would mean nothing to it)."""
    if provider is None or values.get("model"):
        return
    if project.provider is None or project.provider.family != provider.family:
        values["model"] = default_model(provider.family, project.kind)


def draft_values(*, user, settings_: dict | None) -> dict:
    """The model, output settings, params and references of a draft, checked."""
    values = {}
    for key, value in (settings_ or {}).items():
        if key == "duration":
            if value in (None, ""):
                continue
            if not limits.DURATION.contains(value) or not isinstance(value, int):
                raise ServiceError(limits.DURATION.message() + " (seconds)")
            values["duration"] = value
        elif key in DRAFT_FIELDS:
            if value is None:
                continue
            if not isinstance(value, str) or len(value) > (limits.MODEL_CHARS if key == "model" else limits.OPTION_CHARS):
                raise ServiceError(f"{key} must be a short text value")
            values[key] = value.strip()
        elif key == "params":
            within_limits(limits.check_params, value)
            values["params"] = value
        elif key == "references":
            try:
                values["references"] = references.normalize(user, value, store=reference_store)
            except references.BadReference as error:
                raise ServiceError(str(error)) from None
        else:
            raise ServiceError(f"unknown setting {key!r}")
    return values


def drafts_delete(*, user, project: Project, job_ids) -> int:
    with transaction.atomic():
        ids = list(
            Job.objects.filter(project=project, owner=user, id__in=job_ids, status=Status.DRAFT).values_list("id", flat=True)
        )
        # delete() counts cascaded rows (attempts) too: count the jobs alone
        deleted = Job.objects.filter(id__in=ids, status=Status.DRAFT).delete()[1].get(Job._meta.label, 0)
        events.emit_many(project.id, [("job.deleted", job_id, "", {}) for job_id in ids])
    return deleted


# Editing and duplicating drafts, reference uploads (issue 12).


def draft_update(*, user, job_id, prompt: str, provider: Provider | None, settings_: dict) -> Job:
    """Change a draft's prompt, provider and settings (a blank setting: the project's).
    Only a draft changes: one that was started meanwhile answers "no longer a draft"."""
    job = Job.objects.filter(id=job_id, owner=user).select_related("project").first()
    if job is None:
        raise ServiceError("draft not found", 404)
    prompt = (prompt or "").strip()
    if not prompt:
        raise ServiceError("a prompt is required")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ServiceError(f"the prompt is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    if "\x00" in prompt:  # PostgreSQL cannot store it: a clear error, not a 500
        raise ServiceError("the prompt contains a NUL character (\\x00), which cannot be stored")
    draft_provider_check(user=user, project=job.project, provider=provider)
    values = draft_values(user=user, settings_=settings_)
    draft_default_model(project=job.project, provider=provider, values=values)
    # every editable field is written: the ones the form left blank go back to the project's
    fields = {name: values.get(name, "") for name in DRAFT_FIELDS}
    fields.update(
        duration=values.get("duration"), params=values.get("params", job.params), references=values.get("references", [])
    )
    with transaction.atomic():
        changed = Job.objects.filter(id=job.id, status=Status.DRAFT).update(
            prompt=prompt, provider=provider, updated_at=timezone.now(), **fields
        )
        if not changed:
            raise ServiceError("this job is no longer a draft (it was started or deleted)", 409)
        events.emit_many(job.project_id, [("job.edited", job.id, Status.DRAFT, {})])
    job.refresh_from_db()
    return job


def drafts_duplicate(*, user, project: Project, job_ids) -> list[Job]:
    """A new draft for each given draft, with the same prompt, provider and settings."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404)
    originals = list(Job.objects.filter(project=project, id__in=list(job_ids), status=Status.DRAFT).order_by("created_at", "id"))
    if len(originals) > MAX_DRAFTS_PER_REQUEST:
        raise ServiceError(f"{len(originals)} drafts; one request duplicates at most {MAX_DRAFTS_PER_REQUEST}")
    copied = ("prompt", "provider_id", "references", "params", "duration", *DRAFT_FIELDS)
    jobs = [Job(project=project, owner=user, **{name: getattr(job, name) for name in copied}) for job in originals]
    with transaction.atomic():
        Job.objects.bulk_create(jobs)
        events.emit_many(project.id, [("job.drafted", job.id, Status.DRAFT, {}) for job in jobs])
    return jobs


def reference_store(user, data: bytes, *, label: str = "the file") -> str:
    """Keep an uploaded reference image once per content per user; its sha256. The type
    and size come from the bytes (references.image_facts), so a renamed HTML file or an
    SVG is refused with the reason."""
    from django.core.files.base import ContentFile

    try:
        content_type, width, height = references.image_facts(data, label=label)
    except references.BadReference as error:
        raise ServiceError(str(error)) from None
    sha = hashlib.sha256(data).hexdigest()
    if Reference.objects.filter(owner=user, sha256=sha).exists():
        return sha
    row = Reference(owner=user, sha256=sha, content_type=content_type, size=len(data), width=width, height=height)
    row.file.save(f"{sha}.{media_extension(content_type)}", ContentFile(data), save=False)
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError:
        # The same picture uploaded twice at once: the other request's row and file stand;
        # ours (saved under another name by the storage) goes.
        row.file.delete(save=False)
    return sha


def media_extension(content_type: str) -> str:
    from queue_app.engine.media import ALBUM_TYPES

    return ALBUM_TYPES.get(content_type, "bin")


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
        per_job = settings.JOB_STORAGE_ESTIMATE_BYTES
        fits = max(0, (limit - used - pending * per_job) // per_job)
        raise ServiceError(
            f"Storage limit exceeded: {fits} of these {starting} job(s) fit now. "
            f"The album uses {used / MIB:.1f} MB of {limit / MIB:.0f} MB, and every pending job reserves "
            f"{per_job / MIB:.0f} MB ({pending + starting} pending would need ~{needed / MIB:.0f} MB). "
            "Free space by deleting album items or projects, or ask an administrator to raise your limit "
            "(Admin → Account settings, per user).",
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
    jobs = selectors.visible_to(user, Job).filter(status=Status.FAILED)
    if project_id is not None:
        if not selectors.visible_to(user, Project).filter(id=project_id).exists():
            raise ServiceError("project not found", 404)
        jobs = jobs.filter(project_id=project_id)
    if provider_id is not None:
        if not selectors.visible_to(user, Provider).filter(id=provider_id).exists():
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


# --- Selected jobs: the monitor's bulk actions (issue 13) ---------------------------------


def selected_failed_retry(*, user, job_ids) -> dict:
    """The failed jobs among `job_ids` that the user may act on (staff: anyone's) back to
    pending; the others are skipped."""
    job_ids = list(job_ids)
    ids = list(failed_scope(user=user).filter(id__in=job_ids).values_list("id", flat=True))
    started = transitions.jobs_to_pending(ids, from_statuses=(Status.FAILED,), kind="job.retried")
    log.info("retry selected by user %s: %d of %d job(s)", user.pk, len(started), len(job_ids))
    return {"retried": len(started), "skipped": len(job_ids) - len(started)}


def selected_failed_clear(*, user, job_ids) -> dict:
    """Delete the failed jobs among `job_ids` that the user may act on, as
    failed_jobs_clear does for a scope; the others are skipped."""
    job_ids = list(job_ids)
    with transaction.atomic():
        rows = list(
            failed_scope(user=user).filter(id__in=job_ids).select_for_update(of=("self",)).values_list("id", "project_id")
        )
        ids = [job_id for job_id, _ in rows]
        cleared = Job.objects.filter(id__in=ids, status=Status.FAILED).delete()[1].get(Job._meta.label, 0)
        events.emit_grouped([(project_id, "job.cleared", job_id, "", {}) for job_id, project_id in rows])
    projects = sorted({project_id for _, project_id in rows})
    resumed = list(
        Job.objects.filter(project_id__in=projects, status=Status.PENDING).values_list("project_id", flat=True).distinct()
    )
    if resumed:
        transaction.on_commit(lambda: dispatch.wake(project_ids=resumed))
    log.info("clear selected by user %s: %d of %d job(s)", user.pk, cleared, len(job_ids))
    return {"cleared": cleared, "skipped": len(job_ids) - cleared}


# --- Providers --------------------------------------------------------------------------


def provider_may_change(user, provider: Provider) -> bool:
    """Staff may see every provider, but changing another user's needs superuser or the
    Django change permission: `is_staff` alone must not be able to redirect someone's key."""
    return provider.owner_id == user.id or user.is_superuser or user.has_perm("queue_app.change_provider")


def _own_provider(user, provider_id) -> Provider:
    provider = selectors.visible_to(user, Provider).filter(id=provider_id).first()
    if provider is None:
        raise ServiceError("provider not found", 404)
    if not provider_may_change(user, provider):
        raise ServiceError("you may see this provider but not change it: it belongs to another user", 403)
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
    concurrency = concurrency_checked(concurrency)
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


# --- Projects (create / edit / archive / delete) ------------------------------------------

PROJECT_TEXT_FIELDS = {
    "aspect_ratio": 30,
    "quality": 30,
    "resolution": 30,
    "format": 10,
    "background": 20,
    "sound": 10,
    "model": 200,
    "system_prompt": MAX_PROMPT_CHARS,
}
PROJECT_FIELDS = ("name", "kind", "provider_id", *PROJECT_TEXT_FIELDS, "duration", "temperature", "max_tokens")


def _whole(value, name: str, low: int, high: int):
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ServiceError(f"{name} must be a whole number from {low} to {high}")
    return value


def project_values(*, user, data: dict, project: Project | None = None) -> dict:
    """The project fields in `data`, checked (shared by the page form and the API). Only
    the keys present are returned; a new project needs a name. Nothing is saved here."""
    from queue_app.models import Kind
    from queue_app.providers.catalogue import model_spec

    unknown = set(data) - set(PROJECT_FIELDS)
    if unknown:
        raise ServiceError(f"unknown field(s): {', '.join(sorted(unknown))}")
    values = {}
    if "name" in data or project is None:
        name = data.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ServiceError("a project needs a name")
        if len(name.strip()) > 200:
            raise ServiceError("the name is longer than 200 characters")
        values["name"] = name.strip()
    if "kind" in data:
        if data["kind"] not in Kind.values:
            raise ServiceError("kind must be one of " + ", ".join(Kind.values))
        values["kind"] = data["kind"]
    if "provider_id" in data:
        provider_id = data["provider_id"]
        if provider_id in (None, ""):
            values["provider"] = None
        else:
            if isinstance(provider_id, bool) or not isinstance(provider_id, int) or not 1 <= provider_id < 2**63:
                raise ServiceError("provider_id must be a provider's id")
            values["provider"] = Provider.objects.filter(id=provider_id, owner=user).first()
            if values["provider"] is None:
                raise ServiceError("provider not found", 404)
    for name, length in PROJECT_TEXT_FIELDS.items():
        if name in data:
            value = "" if data[name] is None else data[name]
            if not isinstance(value, str) or len(value) > length:
                raise ServiceError(f"{name.replace('_', ' ')} must be text of at most {length} characters")
            values[name] = value.strip()
    if "duration" in data:
        values["duration"] = _whole(data["duration"], "duration", 1, 600)
    if "max_tokens" in data:
        values["max_tokens"] = _whole(data["max_tokens"], "max tokens", 1, 1_000_000)
    if "temperature" in data:
        value = data["temperature"]
        if value in (None, ""):
            values["temperature"] = None
        elif isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
            raise ServiceError("temperature must be a number from 0 to 2")
        else:
            values["temperature"] = float(value)
    kind = values.get("kind", project.kind if project else Kind.IMAGE)
    provider = values["provider"] if "provider" in values else (project.provider if project else None)
    model = values.get("model", project.model if project else "")
    if provider is not None and kind == Kind.COMFYUI:
        raise ServiceError("a ComfyUI project runs on a ComfyUI instance, not a provider: leave the provider empty")
    if provider is not None and model and ("model" in values or "provider" in values or "kind" in values):
        spec = model_spec(provider.family, model, provider.model_aliases)
        known = model in (provider.model_aliases or {}) or spec is not None
        if not known:
            raise ServiceError(f"model {model!r} is not offered by provider {provider.name}")
        if spec is not None and spec.kind != kind:
            raise ServiceError(f"model {model!r} makes {spec.kind}, not {kind}")
    return values


def project_create(*, user, data: dict) -> Project:
    values = project_values(user=user, data=data)
    project = Project.objects.create(owner=user, **values)
    log.info("project %s created by user %s", project.id, user.pk)
    return project


def project_update(*, user, project: Project, data: dict) -> Project:
    """Rename, change kind, provider, model or defaults. Jobs already started keep the
    snapshot they were claimed with; drafts and pending jobs resolve against the new values."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404)
    values = project_values(user=user, data=data, project=project)
    for name, value in values.items():
        setattr(project, name, value)
    project.save()
    return project


def project_set_archived(*, user, project: Project, archived: bool) -> Project:
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404)
    if not isinstance(archived, bool):
        raise ServiceError("archived must be true or false")
    Project.objects.filter(id=project.id).update(archived=archived)
    project.archived = archived
    return project


def project_delete(*, user, project: Project) -> dict:
    """Delete a project with its jobs, album and files (which frees its storage). Refused
    while jobs are processing: a running call would write into a project that is gone."""
    from queue_app.models import AlbumItem

    if project.owner_id != user.id:
        raise ServiceError("project not found", 404)
    with transaction.atomic():
        # Lock the project's job rows, then check: a dispatch claiming one of them now waits
        # for this transaction and then finds it gone (PostgreSQL; SQLite writes one at a time).
        statuses = list(Job.objects.select_for_update().filter(project=project).values_list("status", flat=True))
        running = statuses.count(Status.PROCESSING)
        if running:
            raise ServiceError(f"{running} job{'s are' if running != 1 else ' is'} running; cancel them first", 409)
        files = [
            name for pair in AlbumItem.objects.filter(project=project).values_list("file", "poster") for name in pair if name
        ]
        summary = {
            "jobs": len(statuses),
            "album_items": AlbumItem.objects.filter(project=project).count(),
            "bytes": AlbumItem.objects.filter(project=project).aggregate(total=Sum("size"))["total"] or 0,
        }
        project_id = project.id
        # album items first: their job link is SET_NULL, so they would not go with the jobs
        AlbumItem.objects.filter(project=project).delete()
        Project.objects.filter(id=project_id).delete()
        transaction.on_commit(lambda: _delete_files(files, folder=f"album/{project_id}"))
    log.info("project %s deleted by user %s: %s", project_id, user.pk, summary)
    return summary


def _delete_files(names, *, folder: str = "") -> None:
    """Files go after the commit: a rolled-back delete must not lose them."""
    import os

    from django.core.files.storage import default_storage

    for name in names:
        try:
            default_storage.delete(name)
        except OSError:
            log.warning("could not delete an album file of a deleted project")
    if folder:
        try:  # the project's album folder, when the storage is a local folder and it is empty
            os.rmdir(default_storage.path(folder))
        except (NotImplementedError, OSError):
            pass


# --- Providers (create / edit / delete) -------------------------------------------------

PROVIDER_FIELDS = ("name", "family", "base_url", "api_key", "api_secret", "concurrency", "max_attempts", "paused", "options")
PROVIDER_FIELDS += ("model_aliases",)


def concurrency_checked(value) -> int:
    """The one check of a provider's concurrency (page, API, admin, MCP), against the
    declared limit in queue_app/limits.py, in words a person can act on."""
    bounds = limits.CONCURRENCY
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServiceError(f"concurrency must be a whole number from {bounds.low} to {bounds.high}")
    if value < bounds.low:
        raise ServiceError("concurrency must be at least 1: to stop new work, pause the provider instead")
    if value > bounds.high:
        raise ServiceError(
            f"concurrency can be at most {bounds.high} jobs at once per provider"
            f" (a whole number from {bounds.low} to {bounds.high})"
        )
    return value


def base_url_checked(url) -> str:
    """A provider's base URL override: blank, or an address outbound calls may reach.
    The one home of this check (the provider page, the API and the admin use it)."""
    from queue_app.providers import net

    if url in (None, ""):
        return ""
    if not isinstance(url, str) or len(url) > 200:
        raise ServiceError("the base URL must be a URL of at most 200 characters")
    try:
        return net.validate_base_url(url.strip())
    except ValueError as error:
        raise ServiceError(f"base URL: {error}") from None


def aliases_checked(family: str, aliases) -> dict:
    from queue_app.providers.catalogue import CATALOGUE

    if not isinstance(aliases, dict) or len(aliases) > 100:
        raise ServiceError("model aliases must be an object of at most 100 alias → model pairs")
    models = CATALOGUE.get(family, {})
    cleaned = {}
    for alias, model in aliases.items():
        if not isinstance(alias, str) or not alias.strip() or len(alias) > 200 or not isinstance(model, str):
            raise ServiceError("each model alias needs a name (at most 200 characters) and a model")
        if models and model not in models:
            raise ServiceError(f"alias {alias!r}: {model!r} is not a {family} model (one of {', '.join(models)})")
        cleaned[alias.strip()] = model
    return cleaned


def provider_values(*, user, data: dict, provider: Provider | None = None) -> dict:
    """The provider fields in `data`, checked; nothing saved. Changing the base URL of a
    provider that exists needs its key again, so a stored key never follows a new address."""
    from queue_app.models import Family
    from queue_app.providers.options import clean_options

    unknown = set(data) - set(PROVIDER_FIELDS)
    if unknown:
        raise ServiceError(f"unknown field(s): {', '.join(sorted(unknown))}")
    values = {}
    if "name" in data or provider is None:
        name = data.get("name")
        if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100:
            raise ServiceError("a provider needs a name of at most 100 characters")
        values["name"] = name.strip()
    if "family" in data or provider is None:
        if data.get("family") not in Family.values:
            raise ServiceError("family must be one of " + ", ".join(Family.values))
        values["family"] = data["family"]
    family = values.get("family", provider.family if provider else "")
    for secret in ("api_key", "api_secret"):
        if data.get(secret) not in (None, ""):
            if not isinstance(data[secret], str) or len(data[secret]) > 2000:
                raise ServiceError(f"{secret.replace('_', ' ')} must be text")
            values[secret] = data[secret].strip()
    if "base_url" in data:
        values["base_url"] = base_url_checked(data["base_url"])
        if provider is not None and values["base_url"] != provider.base_url and not values.get("api_key"):
            raise ServiceError("to change the base URL, enter the API key again (a stored key never follows a new address)")
    if "concurrency" in data:
        values["concurrency"] = concurrency_checked(data["concurrency"])
    if "max_attempts" in data:
        value = data["max_attempts"]
        if isinstance(value, bool) or not isinstance(value, int) or not limits.MAX_ATTEMPTS.contains(value):
            raise ServiceError(limits.MAX_ATTEMPTS.message())
        values["max_attempts"] = value
    if "paused" in data:
        if not isinstance(data["paused"], bool):
            raise ServiceError("paused must be true or false")
        values["paused"] = data["paused"]
    if "options" in data or (provider is not None and family != provider.family):
        same_family = provider is not None and family == provider.family
        try:
            values["options"] = clean_options(family, data.get("options") or {}, keep=provider.options if same_family else {})
        except ValueError as error:
            raise ServiceError(str(error)) from None
    if "model_aliases" in data:
        values["model_aliases"] = aliases_checked(family, data["model_aliases"])
    return values


def provider_save(*, user, data: dict, provider: Provider | None = None) -> Provider:
    """Create a provider, or change one: every field is checked before anything is written
    (a refused request changes nothing). Concurrency and pause go through their services,
    which wake dispatch when they free capacity."""
    if provider is not None:
        provider = _own_provider(user, provider.id)
    values = provider_values(user=user, data=data, provider=provider)
    api_key, api_secret = values.pop("api_key", None), values.pop("api_secret", None)
    with transaction.atomic():
        if provider is None:
            provider = Provider(owner=user, **values)
            if api_key:
                provider.api_key = api_key
            if api_secret:
                provider.api_secret = api_secret
            provider.save()
            log.info("provider %s created by user %s", provider.id, user.pk)
            return provider
        concurrency, paused = values.pop("concurrency", None), values.pop("paused", None)
        if api_key:
            provider.api_key = api_key
            values.update(api_key_encrypted=provider.api_key_encrypted, api_key_hint=provider.api_key_hint)
        if api_secret:
            provider.api_secret = api_secret
            values["api_secret_encrypted"] = provider.api_secret_encrypted
        if values:
            Provider.objects.filter(id=provider.id).update(**values)
        if concurrency is not None and concurrency != provider.concurrency:
            provider_set_concurrency(user=user, provider_id=provider.id, concurrency=concurrency)
        if paused is not None and paused != provider.paused:
            provider_set_paused(user=user, provider_id=provider.id, paused=paused)
    log.info("provider %s changed by user %s: %s", provider.id, user.pk, sorted(set(values) | {"concurrency", "paused"}))
    return Provider.objects.get(id=provider.id)


def provider_work(provider: Provider) -> dict:
    """Jobs that still need this provider: pending (its own, or its projects' without a
    provider of their own) and processing (holding one of its slots)."""
    pending = (
        Job.objects.filter(status=Status.PENDING)
        .filter(Q(provider=provider) | Q(provider__isnull=True, project__provider=provider))
        .count()
    )
    processing = Job.objects.filter(status=Status.PROCESSING).filter(Q(active_provider=provider) | Q(provider=provider)).count()
    return {"pending": pending, "processing": processing}


def provider_delete(*, user, provider_id) -> dict:
    """Delete a provider. Refused while it has pending or processing work (pause it and
    let the work finish, or cancel it): deleting it would strand those jobs. Drafts and
    failed jobs that named it, and projects using it, are left without a provider."""
    from django.db.models import ProtectedError

    provider = _own_provider(user, provider_id)
    with transaction.atomic():
        # dispatch locks this row while it hands out slots: no job is claimed meanwhile
        Provider.objects.select_for_update().filter(id=provider.id).first()
        work = provider_work(provider)
        if work["pending"] or work["processing"]:
            raise ServiceError(
                f"{provider.name} still has {work['pending']} pending and {work['processing']} processing job(s): "
                "pause it and let them finish, or cancel them, then delete it",
                409,
            )
        projects = Project.objects.filter(provider=provider).count()
        try:
            provider.delete()
        except ProtectedError:
            raise ServiceError(f"{provider.name} is running a job; try again when it finishes", 409) from None
    log.info("provider %s deleted by user %s", provider_id, user.pk)
    return {"deleted": True, "projects_without_provider": projects}


# --- Album ------------------------------------------------------------------------------


def album_item_delete(*, user, item_id) -> int:
    """Delete one of the user's album items and its files; returns the bytes freed. The
    owner's storage usage is the sum of their items' sizes, so the row going frees them;
    the files go after the commit (a rollback keeps them with their row)."""
    from queue_app.engine.outputs import remove_files
    from queue_app.models import AlbumItem

    with transaction.atomic():
        item = AlbumItem.objects.select_for_update().filter(id=item_id, owner=user).first()
        if item is None:
            raise ServiceError("album item not found", 404)
        names = [name for name in (item.file.name, item.poster.name) if name]
        item.delete()
        events.emit(item.project_id, "album.deleted", item.job_id, "", {"item": item_id, "freed": item.size})
        transaction.on_commit(lambda: remove_files(names))
    return item.size


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
