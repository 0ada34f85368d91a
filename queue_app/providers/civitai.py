"""Civitai Orchestration (v2 workflows): asynchronous, usually done within seconds, so a
detached Civitai job is checked every 5 s.

Shapes: ../shared/providers/civitai.md. Quirks handled here:
- one `imageGen` step per job (`engine`/`ecosystem` from the model's AIR or the draft's
  params), or a whole step given in `params.step`;
- every submit carries the job's tag and its attempt's unique tag: a lost submission is
  looked up by the latter before anyone pays again (`find_submitted`);
- `allowMatureContent: false` is sent explicitly (otherwise a workflow can sit withheld);
- statuses: `unassigned → preparing → scheduled → processing`, then `succeeded | failed |
  expired | canceled`; an unknown status counts as in progress;
- a failed step's `jobs[].reason`: `blocked` is moderation (permanent), `canceled` is
  permanent, `no_provider_available`, `timeout`, `expired` or no reason are worth a
  fresh submission;
- outputs are signed, expiring URLs: downloaded at once, re-read for fresh ones.
"""

import re

from queue_app.providers import http_errors as http
from queue_app.providers.base import (
    AccountError,
    AmbiguousError,
    Failed,
    Finished,
    Output,
    PermanentError,
    ResolvedJob,
    Running,
    Submitted,
)
from queue_app.providers.catalogue import parse_shape

DEFAULT_BASE = "https://orchestration.civitai.com"
POLL_SECONDS = 5.0
# Orchestration publishes no rate limit yet ("fill in once finalized"): the budget module's
# default for an unpublished limit; a record sets its own (status_per_minute).
STATUS_PER_MINUTE = None
LABEL = "Civitai"

TERMINAL_FAILURES = {"failed", "expired", "canceled"}
RETRYABLE_REASONS = {"no_provider_available", "timeout", "expired", ""}
AIR = re.compile(r"^urn:air:([a-z0-9_]+):[a-z]+:", re.IGNORECASE)
OUTPUT_KEYS = ("images", "videos", "video", "blobs", "audios", "audio")


def _base(job: ResolvedJob) -> str:
    return (job.base_url or DEFAULT_BASE).rstrip("/")


def _headers(job: ResolvedJob) -> dict:
    return {"Authorization": f"Bearer {job.api_key}", "Content-Type": "application/json"}


def tag_for(job: ResolvedJob) -> str:
    return f"rs-job-{job.job_id}"


def _tags(job: ResolvedJob) -> list[str]:
    return [tag_for(job)] + ([job.tag] if job.tag else [])


def _raise_for_status(response, *, create: bool) -> None:
    if response.status_code < 400:
        return
    problem = http.error_body(response)
    status = response.status_code
    detail = problem.get("detail") or problem.get("title") or response.reason or ""
    errors = problem.get("errors")
    if isinstance(errors, dict) and errors:
        detail = f"{detail} " + "; ".join(f"{key}: {' '.join(map(str, value))}" for key, value in list(errors.items())[:5])
    message = f"{LABEL} HTTP {status}: {http.short(detail)}"
    if status == 402 or "buzz" in str(detail).lower() and status in (400, 403):
        raise AccountError(f"{message} — not enough Buzz")
    raise http.error_for_status(status, message, create=create, delay=http.retry_delay(response.headers))


def _dimensions(job: ResolvedJob) -> tuple[int, int]:
    """About one megapixel in the requested shape, sides multiples of 64."""
    if job.params.get("width") and job.params.get("height"):
        return int(job.params["width"]), int(job.params["height"])
    ratio = parse_shape(job.aspect_ratio) or 1.0
    height = (1024 * 1024 / ratio) ** 0.5
    width = height * ratio

    def snap(value):
        return max(256, min(2048, int(round(value / 64)) * 64))

    return snap(width), snap(height)


def _step(job: ResolvedJob) -> dict:
    if isinstance(job.params.get("step"), dict):
        return job.params["step"]
    from queue_app.providers.catalogue import model_spec

    spec = model_spec("civitai", job.model)
    extra = dict(spec.extra) if spec else {}
    match = AIR.match(job.model or "")
    width, height = _dimensions(job)
    engine = job.params.get("engine") or extra.get("engine") or "sdcpp"
    inputs = {
        "engine": engine,
        "ecosystem": job.params.get("ecosystem") or extra.get("ecosystem") or (match.group(1).lower() if match else ""),
        "operation": "createVariant" if job.references else "createImage",
        "model": job.model,
        "prompt": job.prompt,
        "width": width,
        "height": height,
    }
    if job.references and engine == "openai":
        # the openai engine edits with every reference (recipes/openai.md: editImage + images[])
        inputs["operation"] = "editImage"
        inputs["images"] = list(job.references)
    elif job.references:
        inputs["image"] = job.references[0]
    for key in ("negativePrompt", "quantity", "seed", "steps", "cfgScale", "loras", "strength", "sampleMethod", "schedule"):
        if key in job.params:
            inputs[key] = job.params[key]
    return {"$type": "imageGen", "input": {key: value for key, value in inputs.items() if value not in ("", None)}}


def _state(workflow: dict, job: ResolvedJob) -> Running | Finished | Failed:
    status = str(workflow.get("status") or "").lower()
    steps = [step for step in workflow.get("steps") or [] if isinstance(step, dict)]
    if status in TERMINAL_FAILURES:
        return _failure(status, steps)
    if status != "succeeded":
        return Running()
    outputs, pending = [], False
    for step in steps:
        output = step.get("output") or {}
        for key in OUTPUT_KEYS:
            entries = output.get(key)
            entries = [entries] if isinstance(entries, dict) else entries if isinstance(entries, list) else []
            for entry in entries:
                if not isinstance(entry, dict):
                    continue
                if not entry.get("url") or entry.get("available") is False:
                    pending = True
                    continue
                content_type = http.content_type_for(entry.get("url", "")) or http.content_type_for(entry.get("id", ""))
                kind = http.kind_of(content_type, "video" if key.startswith("video") else "image")
                poster = entry.get("previewUrl") if kind == "video" else None
                outputs.append(Output(kind=kind, url=entry["url"], content_type=content_type, poster_url=poster))
    if pending and not outputs:
        # Succeeded, blobs not yet available (or withheld): look again; the processing
        # timeout ends a wait that never resolves.
        return Running()
    if not outputs:
        return Failed(reason=f"{LABEL} workflow succeeded without any output (possibly filtered)")
    return Finished(outputs=http.with_roles(job, outputs))


def _failure(status: str, steps: list) -> Failed:
    reasons = []
    for step in steps:
        for sub in step.get("jobs") or []:
            if isinstance(sub, dict) and (sub.get("reason") or sub.get("blockedReason")):
                reasons.append(str(sub.get("reason") or sub.get("blockedReason")))
    if "blocked" in reasons or any("block" in reason.lower() for reason in reasons):
        return Failed(reason=f"{LABEL} blocked the content (moderation): {', '.join(reasons)}")
    if status == "canceled" or "canceled" in reasons:
        return Failed(reason=f"{LABEL} workflow was canceled")
    reason = reasons[0] if reasons else ""
    retry = status == "expired" or reason in RETRYABLE_REASONS
    return Failed(reason=f"{LABEL} workflow {status}{f' ({reason})' if reason else ''}", permanent=not retry)


def submit(job: ResolvedJob) -> Finished | Submitted:
    wait = max(0, min(90, int(job.options.get("wait_seconds", 0) or 0)))
    body = {
        "steps": [_step(job)],
        "tags": _tags(job),
        "metadata": {"jobId": job.job_id},
        "allowMatureContent": bool(job.options.get("allow_mature_content", False)),
    }
    url = f"{_base(job)}/v2/consumer/workflows?wait={wait}"
    try:
        response = http.send("POST", url, create=True, label=LABEL, json=body, headers=_headers(job), timeout=(10, wait + 30))
        _raise_for_status(response, create=True)
        workflow = http.json_body(response, create=True, label=LABEL)
    except AmbiguousError:
        found = find_by_tag(job)
        if found:
            return Submitted(task_id=found)
        raise
    task_id = workflow.get("id")
    state = _state(workflow, job)
    if isinstance(state, Finished):
        return state
    if isinstance(state, Failed):
        raise PermanentError(state.reason) if state.permanent else http.TransientError(state.reason)
    if not task_id:
        found = find_by_tag(job)
        if found:
            return Submitted(task_id=found)
        raise AmbiguousError(f"{LABEL} answered without a workflow id; the workflow may exist")
    return Submitted(task_id=str(task_id))


def find_by_tag(job: ResolvedJob) -> str | None:
    """The workflow this submit created, found by its unique tag (the attempt's, else the
    job's) — read-only, so an ambiguous submit is never paid twice. None when nothing
    (readable) is found."""
    try:
        found = find_submitted(job, job.tag or tag_for(job), None)
    except http.ProviderError:
        return None
    return found[0] if found else None


def find_submitted(job: ResolvedJob, tag: str, since=None) -> list[str]:
    """The workflows carrying `tag` (QueryWorkflows by tag), newest first: what an earlier
    attempt's submission created. A failed lookup raises TransientError: the caller must
    not pay again blind."""
    url = f"{_base(job)}/v2/consumer/workflows?tags={tag}&take=5&hideMatureContent=false"
    response = http.send("GET", url, create=False, label=LABEL, headers=_headers(job))
    if response.status_code != 200:
        raise http.TransientError(f"{LABEL} workflow lookup by tag answered HTTP {response.status_code}")
    body = http.json_body(response, create=False, label=LABEL)
    items = body.get("items") if isinstance(body, dict) else None
    return [
        str(item["id"])
        for item in items or []
        if isinstance(item, dict) and item.get("id") and tag in (item.get("tags") or [tag])
    ]


def check(task_id: str, job: ResolvedJob) -> Running | Finished | Failed:
    url = f"{_base(job)}/v2/consumer/workflows/{http.segment(task_id)}"
    response = http.send("GET", url, create=False, label=LABEL, headers=_headers(job))
    if response.status_code == 404:
        return Failed(reason=f"{LABEL} no longer knows workflow {task_id[:40]} (404)")
    _raise_for_status(response, create=False)
    return _state(http.json_body(response, create=False, label=LABEL), job)


def cancel(task_id: str, job: ResolvedJob) -> None:
    """Cancel a workflow (UpdateWorkflow: `PUT /v2/consumer/workflows/{id}` with status
    `canceled`; work not yet started may be refunded). A 404 is fine: nothing runs."""
    url = f"{_base(job)}/v2/consumer/workflows/{http.segment(task_id)}"
    response = http.send("PUT", url, create=False, label=LABEL, json={"status": "canceled"}, headers=_headers(job))
    if response.status_code != 404:
        _raise_for_status(response, create=False)
