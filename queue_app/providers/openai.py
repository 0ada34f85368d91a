"""OpenAI: images (generations; edits when the draft has references), text (chat
completions) — synchronous; Sora video — asynchronous (`/videos`, polled).

Shapes: ../shared/providers/openai.md. Quirks handled here:
- images come back as `data[].b64_json` (GPT image models; DALL·E when asked) or
  `data[].url` (DALL·E, expires after an hour: downloaded by the output writer at once);
- a 429 with `insufficient_quota` (or another billing code) is not a rate limit: permanent
  until someone pays, so it is not retried;
- `moderation_blocked` / `content_policy_violation` are permanent for that prompt;
- plain HTTP, no SDK: openai-python retries POSTs on its own without an idempotency key.
"""

from queue_app.providers import http_errors as http
from queue_app.providers.base import (
    AccountError,
    Failed,
    Finished,
    Output,
    PermanentError,
    ResolvedJob,
    Running,
    Submitted,
)
from queue_app.providers.catalogue import parse_shape, resolve_option

DEFAULT_BASE = "https://api.openai.com/v1"
POLL_SECONDS = None  # the default 30 s cycle (video only; images and text are synchronous)
# Per usage tier, read from x-ratelimit-* headers, no public number: 500 a minute is the
# lowest paid tier's request limit for most endpoints.
STATUS_PER_MINUTE = 500
LABEL = "OpenAI"

QUOTA_CODES = {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active", "account_deactivated"}
MODERATION_CODES = {"moderation_blocked", "content_policy_violation", "content_filter"}
GPT_IMAGE_PREFIXES = ("gpt-image", "chatgpt-image")
GPT_SIZES = ("1024x1024", "1536x1024", "1024x1536")
DALLE3_SIZES = ("1024x1024", "1792x1024", "1024x1792")
VIDEO_SIZES = ("1280x720", "720x1280", "1792x1024", "1024x1792")
VIDEO_SECONDS = (4, 8, 12)


def _base(job: ResolvedJob) -> str:
    return (job.base_url or DEFAULT_BASE).rstrip("/")


def _headers(job: ResolvedJob, *, json: bool = True) -> dict:
    headers = {"Authorization": f"Bearer {job.api_key}"}
    if json:
        headers["Content-Type"] = "application/json"
    if job.options.get("organization"):
        headers["OpenAI-Organization"] = str(job.options["organization"])
    if job.options.get("project"):
        headers["OpenAI-Project"] = str(job.options["project"])
    return headers


def _raise_for_status(response, *, create: bool) -> None:
    if response.status_code < 400:
        return
    error = http.error_body(response).get("error")
    error = error if isinstance(error, dict) else {}
    message = http.short(error.get("message") or response.reason or "")
    code, kind = str(error.get("code") or ""), str(error.get("type") or "")
    status = response.status_code
    if code in MODERATION_CODES or kind == "image_generation_user_error" and "moderation" in message.lower():
        raise PermanentError(f"{LABEL} refused the request (content policy, {code or kind}): {message}")
    if code in QUOTA_CODES or kind in QUOTA_CODES:
        raise AccountError(f"{LABEL} quota or billing problem ({code or kind}): {message} — check the account's billing")
    if status == 401:
        raise AccountError(f"{LABEL} rejected the credentials (HTTP 401): {message}")
    if status == 403:
        raise PermanentError(f"{LABEL} refused access (HTTP 403): {message}")
    reason = f"{LABEL} HTTP {status}{f' {code}' if code else ''}: {message}"
    raise http.error_for_status(status, reason, create=create, delay=http.retry_delay(response.headers))


def _post(job: ResolvedJob, path: str, **kwargs) -> dict:
    response = http.send("POST", f"{_base(job)}{path}", create=True, label=LABEL, **kwargs)
    _raise_for_status(response, create=True)
    return http.json_body(response, create=True, label=LABEL)


# --- submit ---------------------------------------------------------------------------


def submit(job: ResolvedJob) -> Finished | Submitted:
    handler = {"image": _image, "text": _text, "video": _video}.get(job.kind)
    if handler is None:
        raise PermanentError(f"{LABEL} does not generate {job.kind} here")
    return handler(job)


def _size(job: ResolvedJob, model: str) -> str:
    requested = job.aspect_ratio or job.resolution
    if requested == "auto" or (parse_shape(requested) and "x" in requested.lower() and model.startswith("gpt-image-2")):
        return requested
    if model == "dall-e-3":
        return resolve_option(requested, DALLE3_SIZES)
    if model == "dall-e-2":
        return resolve_option(requested, ("1024x1024", "512x512", "256x256"))
    return resolve_option(requested, GPT_SIZES)


def _image(job: ResolvedJob) -> Finished:
    model = job.model or "gpt-image-1.5"
    gpt = model.startswith(GPT_IMAGE_PREFIXES)
    fields = {"model": model, "prompt": job.prompt, "size": _size(job, model)}
    n = int(job.params.get("n", 1) or 1)
    fields["n"] = 1 if model == "dall-e-3" else max(1, min(10, n))
    if job.quality:
        fields["quality"] = job.quality
    if gpt:
        if job.background:
            fields["background"] = job.background
        if job.format:
            fields["output_format"] = job.format
        if job.params.get("moderation") in ("low", "auto"):
            fields["moderation"] = job.params["moderation"]
    else:
        fields["response_format"] = job.options.get("response_format", "b64_json")
        if model == "dall-e-3" and job.params.get("style") in ("vivid", "natural"):
            fields["style"] = job.params["style"]
    if job.references:
        files = []
        name = "image[]" if len(job.references) > 1 else "image"
        for number, reference in enumerate(job.references[:16]):
            data, content_type = http.reference_bytes(reference, label=LABEL)
            files.append((name, (f"reference-{number}.{content_type.rsplit('/', 1)[-1]}", data, content_type)))
        data_fields = {key: str(value) for key, value in fields.items()}
        body = _post(job, "/images/edits", data=data_fields, files=files, headers=_headers(job, json=False))
    else:
        body = _post(job, "/images/generations", json=fields, headers=_headers(job))
    content_type = http.CONTENT_TYPES.get(body.get("output_format") or job.format or "png", "image/png")
    outputs = []
    for item in body.get("data") or []:
        if not isinstance(item, dict):
            continue
        if item.get("b64_json"):
            outputs.append(Output(kind="image", data=http.decode_b64(item["b64_json"], label=LABEL), content_type=content_type))
        elif item.get("url"):
            outputs.append(Output(kind="image", url=item["url"]))
    if not outputs:
        raise PermanentError(f"{LABEL} reported success but returned no image")
    return Finished(outputs=http.with_roles(job, outputs), usage=_usage(body))


def _text(job: ResolvedJob) -> Finished:
    messages = []
    if job.system_prompt:
        messages.append({"role": "system", "content": job.system_prompt})
    messages.append({"role": "user", "content": job.prompt})
    fields = {"model": job.model or "gpt-4.1-mini", "messages": messages}
    if job.max_tokens:
        fields["max_completion_tokens"] = job.max_tokens
    if job.temperature is not None:
        fields["temperature"] = job.temperature
    body = _post(job, "/chat/completions", json=fields, headers=_headers(job))
    choices = body.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    text = (choice.get("message") or {}).get("content") or ""
    if choice.get("finish_reason") == "content_filter" and not text:
        raise PermanentError(f"{LABEL} withheld the answer (content filter)")
    if not isinstance(text, str) or not text.strip():
        raise PermanentError(f"{LABEL} reported success but returned no text")
    return Finished(outputs=[Output(kind="text", text=text, content_type="text/plain")], usage=_usage(body))


def _usage(body: dict) -> dict:
    """The tokens OpenAI billed: `usage` of a GPT image (input/output_tokens) or a chat
    completion (prompt/completion_tokens)."""
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    tokens_in = usage.get("input_tokens", usage.get("prompt_tokens"))
    tokens_out = usage.get("output_tokens", usage.get("completion_tokens"))
    if isinstance(tokens_in, int) and isinstance(tokens_out, int):
        return {"input_tokens": tokens_in, "output_tokens": tokens_out}
    return {}


def _video(job: ResolvedJob) -> Submitted:
    seconds = job.duration if job.duration in VIDEO_SECONDS else min(VIDEO_SECONDS, key=lambda s: abs(s - (job.duration or 4)))
    fields = {
        "model": job.model or "sora-2",
        "prompt": job.prompt,
        "size": resolve_option(job.aspect_ratio or job.resolution, VIDEO_SIZES),
        "seconds": str(seconds),
    }
    if job.references:
        data, content_type = http.reference_bytes(job.references[0], label=LABEL)
        files = [("input_reference", (f"reference.{content_type.rsplit('/', 1)[-1]}", data, content_type))]
        body = _post(job, "/videos", data=fields, files=files, headers=_headers(job, json=False))
    else:
        body = _post(job, "/videos", json=fields, headers=_headers(job))
    if body.get("status") == "failed":
        raise PermanentError(f"{LABEL} video failed at once: {_video_error(body)}")
    if not body.get("id"):
        raise http.AmbiguousError(f"{LABEL} accepted the video request but sent no id")
    return Submitted(task_id=str(body["id"]))


# --- check (video) ----------------------------------------------------------------------


def _video_error(body: dict) -> str:
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    return http.short(error.get("message") or error.get("code") or "no reason given")


def check(task_id: str, job: ResolvedJob) -> Running | Finished | Failed:
    url = f"{_base(job)}/videos/{http.segment(task_id)}"
    response = http.send("GET", url, create=False, label=LABEL, headers=_headers(job))
    if response.status_code == 404:
        return Failed(reason=f"{LABEL} no longer knows video {task_id[:40]} (404: expired or deleted)")
    _raise_for_status(response, create=False)
    body = http.json_body(response, create=False, label=LABEL)
    status = str(body.get("status") or "")
    if status in ("queued", "in_progress", ""):
        progress = body.get("progress")
        return Running(progress=progress / 100 if isinstance(progress, int | float) else None)
    if status == "completed":
        content = f"{url}/content"
        return Finished(
            outputs=[
                Output(
                    kind="video",
                    url=content,
                    content_type="video/mp4",
                    headers={"Authorization": f"Bearer {job.api_key}"},
                    poster_url=f"{content}?variant=thumbnail",
                )
            ]
        )
    if status == "failed":
        return Failed(reason=f"{LABEL} video failed: {_video_error(body)}")
    # An unknown status: keep polling; the processing timeout bounds it.
    return Running()


def cancel(task_id: str, job: ResolvedJob) -> None:
    """Stop a video task: `DELETE /v1/videos/{id}` (only videos are detached tasks)."""
    url = f"{_base(job)}/videos/{http.segment(task_id)}"
    response = http.send("DELETE", url, create=False, label=LABEL, headers=_headers(job))
    if response.status_code != 404:
        _raise_for_status(response, create=False)
