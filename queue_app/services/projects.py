"""Projects: validate, create, edit, archive and delete."""

import logging

from django.db import transaction
from django.db.models import Sum

from queue_app import limits
from queue_app.models import Job, Kind, Project, Provider, Status
from queue_app.services.drafts import MAX_PROMPT_CHARS
from queue_app.services.errors import ServiceError, refuse_unknown
from queue_app.services.jobs import jobs_cancel
from queue_app.services.storage import _delete_files

log = logging.getLogger(__name__)


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


PROJECT_FIELDS = ("name", "kind", "provider_id", *PROJECT_TEXT_FIELDS, "duration", "temperature", "max_tokens", "share_weight")


def _whole(value, name: str, low: int, high: int):
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ServiceError(f"{name} must be a whole number from {low} to {high}")
    return value


def _temperature(value) -> float | None:
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
        raise ServiceError("temperature must be a number from 0 to 2")
    return float(value)


def _share_weight(value) -> int:
    """A project's weight in fair share (blank: the default, 1)."""
    if value in (None, ""):
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not limits.SHARE_WEIGHT.contains(value):
        raise ServiceError(limits.SHARE_WEIGHT.message().replace("share_weight", "the fair-share weight"))
    return value


def project_values(*, user, data: dict, project: Project | None = None) -> dict:
    """The project fields in `data`, checked (shared by the page form and the API). Only
    the keys present are returned; a new project needs a name. Nothing is saved here."""
    from queue_app.providers.catalogue import model_spec

    refuse_unknown(data, PROJECT_FIELDS)
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
                raise ServiceError("provider not found", 404, field="provider_id")
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
        values["temperature"] = _temperature(data["temperature"])
    if "share_weight" in data:
        values["share_weight"] = _share_weight(data["share_weight"])
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
        raise ServiceError("project not found", 404, field="project_id")
    values = project_values(user=user, data=data, project=project)
    for name, value in values.items():
        setattr(project, name, value)
    project.save()
    return project


def project_set_archived(*, user, project: Project, archived: bool) -> Project:
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404, field="project_id")
    if not isinstance(archived, bool):
        raise ServiceError("archived must be true or false")
    Project.objects.filter(id=project.id).update(archived=archived)
    project.archived = archived
    return project


def project_delete(*, user, project: Project) -> dict:
    """Delete a project with its jobs, album and files (which frees its storage). Its
    pending and processing jobs are cancelled first, in the same transaction: a running
    call's result is fenced out by its lease token, a detached task is cancelled at its
    provider once this commits, and the slots go to other projects' work at once."""
    from queue_app.models import AlbumItem

    if project.owner_id != user.id:
        raise ServiceError("project not found", 404, field="project_id")
    with transaction.atomic():
        # Lock the project's job rows, then check: a dispatch claiming one of them now waits
        # for this transaction and then finds it gone (PostgreSQL; SQLite writes one at a time).
        rows = list(Job.objects.select_for_update().filter(project=project).values_list("id", "status"))
        statuses = [status for _, status in rows]
        active = [str(job_id) for job_id, status in rows if status in (Status.PENDING, Status.PROCESSING)]
        cancelled = jobs_cancel(user=project.owner, job_ids=active)["cancelled"] if active else 0
        files = [
            name for pair in AlbumItem.objects.filter(project=project).values_list("file", "poster") for name in pair if name
        ]
        summary = {
            "jobs": len(statuses),
            "album_items": AlbumItem.objects.filter(project=project).count(),
            "bytes": AlbumItem.objects.filter(project=project).aggregate(total=Sum("size"))["total"] or 0,
            "cancelled": cancelled,
        }
        project_id = project.id
        # album items first: their job link is SET_NULL, so they would not go with the jobs
        AlbumItem.objects.filter(project=project).delete()
        Project.objects.filter(id=project_id).delete()
        transaction.on_commit(lambda: _delete_files(files, folder=f"album/{project_id}"))
    log.info("project %s deleted by user %s: %s", project_id, user.pk, summary)
    return summary
