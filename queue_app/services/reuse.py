"""Reuse (issue 29): "do that again with this change". New drafts from any jobs — drafts,
completed, failed, an album item's — with the same prompt, provider, model, settings and
references, and the change applied: a new prompt (`{prompt}` in it stands for the old
one) and any setting. And the user's saved prompt templates."""

from django.db import transaction

from queue_app import limits
from queue_app.engine import events
from queue_app.models import Job, Project, PromptTemplate, Provider, Status
from queue_app.services.drafts import (
    DRAFT_FIELDS,
    draft_default_model,
    draft_provider_check,
    draft_values,
    prompt_checked,
)
from queue_app.services.errors import ServiceError
from queue_app.services.storage import references_store_new

COPIED = ("prompt", "provider_id", "references", "params", "duration", *DRAFT_FIELDS)


def jobs_reuse(
    *,
    user,
    project: Project,
    job_ids,
    prompt: str = "",
    provider: Provider | None = None,
    providers: list[Provider] = (),
    settings_: dict | None = None,
) -> list[Job]:
    """A new draft for each of the project's given jobs (any status), in their order, with
    `prompt` (`{prompt}`: the job's own) and `settings_` / `provider` changed — or, with
    `providers`, one per job and provider (a selection fanned out). Checked whole before
    anything is created."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404, field="project_id")
    ids = list(job_ids)
    if not ids or len(ids) > limits.JOB_IDS:
        raise ServiceError(f"name 1 to {limits.JOB_IDS} jobs to reuse")
    originals = list(Job.objects.filter(project=project, id__in=ids).order_by("created_at", "id"))
    if len(originals) != len(set(ids)):
        raise ServiceError("a job to reuse was not found in this project", 404, field="job_ids")
    targets = list(providers) or [provider]
    if len(originals) * len(targets) > limits.QUANTITY.high:
        raise ServiceError(
            f"{len(originals)} job(s) × {len(targets)} provider(s); one request makes at most {limits.QUANTITY.high}"
        )
    for target in targets:
        if target is not None:
            draft_provider_check(user=user, project=project, provider=target)
    changes = draft_values(user=user, settings_=settings_ or {})
    if "references" in changes:
        changes["references"] = references_store_new(user, changes["references"])
    jobs = []
    for original in originals:
        text = prompt_checked(prompt.replace("{prompt}", original.prompt) if prompt else original.prompt)
        for target in targets:
            fields = {name: getattr(original, name) for name in COPIED}
            fields.update(prompt=text, **changes)
            if target is not None:
                retarget(project, original, target, fields)
            jobs.append(Job(project=project, owner=user, **fields))
    with transaction.atomic():
        Job.objects.bulk_create(jobs)
        events.emit_many(project.id, [("job.drafted", job.id, Status.DRAFT, {}) for job in jobs])
    return jobs


def retarget(project: Project, original: Job, target: Provider, fields: dict) -> None:
    """The copy runs on `target`; a model of another family than the original ran on means
    nothing there, so it takes the project's or the family's default (unless one was given)."""
    ran_on = original.provider or project.provider
    fields["provider_id"] = target.id
    if "model" in fields and ran_on is not None and ran_on.family != target.family and fields["model"] == original.model:
        fields["model"] = ""
        draft_default_model(project=project, provider=target, values=fields)


def prompt_template_save(*, user, name: str, text: str) -> PromptTemplate:
    name = (name or "").strip() if isinstance(name, str) else ""
    if not name or len(name) > 100:
        raise ServiceError("a template's name is 1 to 100 characters", field="name")
    text = prompt_checked(text)
    with transaction.atomic():
        row, _ = PromptTemplate.objects.update_or_create(owner=user, name=name, defaults={"text": text})
    return row


def prompt_template_delete(*, user, name: str) -> int:
    return PromptTemplate.objects.filter(owner=user, name=name).delete()[0]
