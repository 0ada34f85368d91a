"""JSON API of one draft: `PATCH /api/drafts/<id>` edits it (only the keys sent change;
`provider_id: null` returns it to the project's provider), `DELETE` deletes it. The same
services and reference checks as the project page (queue_app.web.drafts).

`POST /api/references` takes one reference image as a multipart upload (field `file`, up
to limits.REFERENCE_BYTES, streamed to disk) and answers its album-independent
"ref:<sha256>" id, which any draft of the account may name (API, MCP, pages). An upload no
draft names is removed after limits.REFERENCE_GRACE_SECONDS.
"""

from django.core.exceptions import BadRequest, RequestDataTooBig, TooManyFilesSent
from django.http.multipartparser import MultiPartParserError

from queue_app.models import Job, Provider, Status
from queue_app.services.drafts import DRAFT_FIELDS, draft_update, drafts_delete
from queue_app.services.errors import ServiceError, refuse_unknown
from queue_app.services.storage import reference_upload
from queue_app.web.api import answer, endpoint

SETTING_KEYS = (*DRAFT_FIELDS, "duration", "params", "references")


def whole_number(value, name: str, *, low: int, high: int, default=None) -> int:
    if value in (None, ""):
        if default is None:
            raise ServiceError(f"{name} is required")
        return default
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ServiceError(f"{name} must be a whole number") from None
    if isinstance(value, bool) or isinstance(value, float) or not low <= number <= high:
        raise ServiceError(f"{name} must be a whole number from {low} to {high}")
    return number


def draft_payload(job: Job) -> dict:
    return {
        "id": str(job.id),
        "status": job.status,
        "prompt": job.prompt,
        "provider_id": job.provider_id,
        "references": job.references,
        "settings": {name: getattr(job, name) for name in (*DRAFT_FIELDS, "duration", "params")},
    }


def patch_body(body: dict) -> dict:
    """The PATCH body (already parsed and bounded by the endpoint), its fields checked."""
    refuse_unknown(body, {"prompt", "provider_id", "settings", *SETTING_KEYS})
    if body.get("settings") is not None and not isinstance(body["settings"], dict):
        raise ServiceError("settings must be an object")
    return body


@endpoint("PATCH", "DELETE")
def draft_view(request, body, job_id):
    if request.method == "DELETE":
        return answer(draft_remove(request.user, job_id))
    return answer(draft_change(request.user, job_id, body))


def own_draft(user, job_id) -> Job:
    """The user's draft, or the refusal: unknown or another user's 404, started 409."""
    job = Job.objects.filter(id=job_id, owner=user).select_related("project", "provider").first()
    if job is None:
        raise ServiceError("draft not found", 404, field="job_id")
    if job.status != Status.DRAFT:
        raise ServiceError("this job is no longer a draft (it was started)", 409, reason="not_a_draft")
    return job


def draft_remove(user, job_id) -> dict:
    job = own_draft(user, job_id)
    drafts_delete(user=user, project=job.project, job_ids=[job.id])
    return {"deleted": 1}


def draft_change(user, job_id, body: dict) -> dict:
    """Edit a draft: only the keys in `body` change (the API's PATCH and the MCP tool)."""
    job = own_draft(user, job_id)
    body = patch_body(body)
    settings_ = {name: getattr(job, name) for name in (*DRAFT_FIELDS, "duration", "params", "references")}
    settings_.update(body.get("settings") or {})
    settings_.update({key: body[key] for key in SETTING_KEYS if key in body})
    provider = job.provider
    if "provider_id" in body:
        if "model" not in body and "model" not in (body.get("settings") or {}):
            settings_["model"] = ""  # another provider: its default model unless one is named
        provider = None
        if body["provider_id"] is not None:
            provider_id = whole_number(body["provider_id"], "provider_id", low=1, high=2**62)
            provider = Provider.objects.filter(id=provider_id, owner=user).first()
            if provider is None:
                raise ServiceError("provider not found", 404, field="provider_id")
    prompt = body["prompt"] if "prompt" in body else job.prompt
    if not isinstance(prompt, str):
        raise ServiceError("prompt must be text", field="prompt")
    job = draft_update(user=user, job_id=job.id, prompt=prompt, provider=provider, settings_=settings_)
    return draft_payload(job)


@endpoint("POST", json_body=False)
def references_view(request, body):
    """One image in, its "ref:<sha256>" out (201; the same image again: 200, stored once)."""
    if not request.content_type.startswith("multipart/form-data"):
        raise ServiceError("send the image as multipart/form-data in a field named file", 415)
    try:
        files = request.FILES.getlist("file")
    except (MultiPartParserError, RequestDataTooBig, TooManyFilesSent, BadRequest) as refusal:
        raise ServiceError(f"the upload could not be read: {refusal}") from None
    if len(files) != 1:
        raise ServiceError("send exactly one image in a field named file")
    row, created = reference_upload(user=request.user, upload=files[0], label=repr(files[0].name[:60]))
    payload = {
        "reference": f"ref:{row.sha256}",
        "sha256": row.sha256,
        "content_type": row.content_type,
        "size": row.size,
        "width": row.width,
        "height": row.height,
    }
    return answer(payload, 201 if created else 200)
