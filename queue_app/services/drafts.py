"""Draft jobs: create, edit, duplicate and delete them before they are started."""

from django.db import transaction
from django.utils import timezone

from queue_app import limits
from queue_app.engine import attempt_tally, events
from queue_app.models import Job, Kind, Project, Provider, Status
from queue_app.providers.catalogue import CATALOGUE, default_model
from queue_app.services import references
from queue_app.services.errors import ServiceError, within_limits
from queue_app.services.storage import references_store_new

MAX_DRAFTS_PER_REQUEST = limits.QUANTITY.high


MAX_PROMPT_CHARS = limits.PROMPT_CHARS


DRAFT_FIELDS = ("model", "aspect_ratio", "quality", "resolution", "format", "background", "sound")


def prompt_checked(prompt) -> str:
    """A draft's prompt, stripped, or a ServiceError saying what is wrong with it."""
    prompt = (prompt or "").strip()
    if not prompt:
        raise ServiceError("a prompt is required")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ServiceError(f"the prompt is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    if "\x00" in prompt:  # PostgreSQL cannot store it: a clear error, not a 500
        raise ServiceError("the prompt contains a NUL character (\\x00), which cannot be stored")
    return prompt


def jobs_create_drafts(
    *,
    user,
    project: Project,
    prompt: str,
    quantity: int = 1,
    provider: Provider | None = None,
    settings_: dict | None = None,
    per_line: bool = False,
    uploads=(),
) -> list[Job]:
    """Create `quantity` drafts of one prompt — or, `per_line`, of each non-blank line of
    it, naming the form's `uploads` (image files) after their references. Validates
    everything first: a bad value is a ServiceError with a readable message, and nothing
    is created or stored."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404, field="project_id")
    prompt = prompt_checked(prompt)
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= MAX_DRAFTS_PER_REQUEST:
        raise ServiceError(f"quantity must be a whole number from 1 to {MAX_DRAFTS_PER_REQUEST}")
    prompts = [line.strip() for line in prompt.splitlines() if line.strip()] if per_line else [prompt]
    if len(prompts) * quantity > MAX_DRAFTS_PER_REQUEST:
        raise ServiceError(
            f"{len(prompts)} line(s) × quantity {quantity} = {len(prompts) * quantity} drafts; "
            f"one request makes at most {MAX_DRAFTS_PER_REQUEST}"
        )
    draft_provider_check(user=user, project=project, provider=provider)
    values = draft_values(user=user, settings_=settings_, uploads=uploads)
    draft_default_model(project=project, provider=provider, values=values)
    if "references" in values:  # valid in full: now the new images are stored
        values["references"] = references_store_new(user, values["references"])
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
        raise ServiceError("provider not found", 404, field="provider_id")
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


def draft_values(*, user, settings_: dict | None, uploads=()) -> dict:
    """The model, output settings, params and references of a draft, checked; images not
    stored yet stay `references.New` (the caller stores them once the draft is valid)."""
    values = {}
    settings_ = dict(settings_ or {})
    if uploads:
        settings_.setdefault("references", [])
    for key, value in settings_.items():
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
                values["references"] = references.normalize(user, value, uploads=uploads)
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
        doomed = Job.objects.filter(id__in=ids, status=Status.DRAFT)
        attempt_tally.fold_jobs(doomed.values_list("id", flat=True))  # a draft put back keeps its attempts
        deleted = doomed.delete()[1].get(Job._meta.label, 0)
        events.emit_many(project.id, [("job.deleted", job_id, "", {}) for job_id in ids])
    return deleted


def draft_update(*, user, job_id, prompt: str, provider: Provider | None, settings_: dict, uploads=()) -> Job:
    """Change a draft's prompt, provider and settings (a blank setting: the project's),
    adding the form's `uploads` to its references. Only a draft changes: one that was
    started meanwhile answers "no longer a draft"; a refusal stores nothing."""
    job = Job.objects.filter(id=job_id, owner=user).select_related("project").first()
    if job is None:
        raise ServiceError("draft not found", 404, field="job_id")
    prompt = prompt_checked(prompt)
    draft_provider_check(user=user, project=job.project, provider=provider)
    values = draft_values(user=user, settings_=settings_, uploads=uploads)
    draft_default_model(project=job.project, provider=provider, values=values)
    if "references" in values:
        values["references"] = references_store_new(user, values["references"])
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
            raise ServiceError("this job is no longer a draft (it was started or deleted)", 409, reason="not_a_draft")
        events.emit_many(job.project_id, [("job.edited", job.id, Status.DRAFT, {})])
    job.refresh_from_db()
    return job


def drafts_duplicate(*, user, project: Project, job_ids) -> list[Job]:
    """A new draft for each given draft, with the same prompt, provider and settings."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404, field="project_id")
    originals = list(Job.objects.filter(project=project, id__in=list(job_ids), status=Status.DRAFT).order_by("created_at", "id"))
    if len(originals) > MAX_DRAFTS_PER_REQUEST:
        raise ServiceError(f"{len(originals)} drafts; one request duplicates at most {MAX_DRAFTS_PER_REQUEST}")
    copied = ("prompt", "provider_id", "references", "params", "duration", *DRAFT_FIELDS)
    jobs = [Job(project=project, owner=user, **{name: getattr(job, name) for name in copied}) for job in originals]
    with transaction.atomic():
        Job.objects.bulk_create(jobs)
        events.emit_many(project.id, [("job.drafted", job.id, Status.DRAFT, {}) for job in jobs])
    return jobs
