"""Google Gemini API: images and text through `generateContent` (synchronous); Veo video
through `predictLongRunning` operations (asynchronous, polled).

Shapes: ../shared/providers/google-gemini.md. Quirks handled here:
- the key goes in the `x-goog-api-key` header (never the query string, so it stays out of logs);
- `imageConfig` (aspect ratio, size) goes inside `generationConfig`, as does `thinkingConfig`;
- images are `inlineData` parts; parts marked `thought` are skipped; every part is scanned;
- blocks arrive as HTTP 200: `promptFeedback.blockReason`, or a candidate whose
  `finishReason` is a safety reason — permanent, with a readable reason;
- a bad key is HTTP 400 `API_KEY_INVALID`, not 401;
- no Retry-After: the delay is `RetryInfo.retryDelay` in the error details, and a daily
  quota waits for the reset at midnight Pacific time.
"""

import base64
import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

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
    TransientError,
)

DEFAULT_BASE = "https://generativelanguage.googleapis.com/v1beta"
POLL_SECONDS = None  # the default 30 s cycle (Veo only)
# Per project and tier, not published for operation reads: the budget module's default for
# an unpublished limit.
STATUS_PER_MINUTE = None
LABEL = "Gemini"

BLOCK_FINISH = {
    "SAFETY",
    "PROHIBITED_CONTENT",
    "BLOCKLIST",
    "SPII",
    "RECITATION",
    "IMAGE_SAFETY",
    "IMAGE_PROHIBITED_CONTENT",
    "IMAGE_RECITATION",
}
# Non-deterministic: worth another try (bounded by the provider's attempts).
RETRY_FINISH = {"NO_IMAGE", "IMAGE_OTHER", "OTHER"}
RATIO = re.compile(r"^\d+:\d+$")
IMAGE_SIZE = re.compile(r"^[124]k$", re.IGNORECASE)
OPERATION = re.compile(r"^[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)*$")
# google.rpc codes of a failed operation that are worth a fresh submission
RETRYABLE_RPC_CODES = {4, 8, 13, 14}  # DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE


def _base(job: ResolvedJob) -> str:
    return (job.base_url or DEFAULT_BASE).rstrip("/")


def _headers(job: ResolvedJob) -> dict:
    return {"x-goog-api-key": job.api_key, "Content-Type": "application/json"}


def _duration(value: str) -> float | None:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)s\s*", value or "")
    return float(match.group(1)) if match else None


def _until_pacific_midnight(now: datetime | None = None) -> float:
    pacific = ZoneInfo("America/Los_Angeles")
    now = now.astimezone(pacific) if now else datetime.now(pacific)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(60.0, (midnight - now).total_seconds())


def retry_hint(error: dict) -> float | None:
    """RetryInfo.retryDelay, or the time to the daily reset for a per-day quota."""
    delay = None
    for detail in error.get("details") or []:
        if not isinstance(detail, dict):
            continue
        kind = str(detail.get("@type", ""))
        if kind.endswith("google.rpc.QuotaFailure"):
            for violation in detail.get("violations") or []:
                if "perday" in str((violation or {}).get("quotaId", "")).lower():
                    return _until_pacific_midnight()
        if kind.endswith("google.rpc.RetryInfo"):
            delay = _duration(str(detail.get("retryDelay", "")))
    return delay


def _raise_for_status(response, *, create: bool) -> None:
    if response.status_code < 400:
        return
    error = http.error_body(response).get("error")
    error = error if isinstance(error, dict) else {}
    status = response.status_code
    message = http.short(error.get("message") or response.reason or "")
    reasons = {str((d or {}).get("reason", "")) for d in error.get("details") or [] if isinstance(d, dict)}
    if "API_KEY_INVALID" in reasons:
        raise AccountError(f"{LABEL} rejected the API key (API_KEY_INVALID)")
    rpc = error.get("status") or ""
    delay = retry_hint(error) or http.retry_delay(response.headers)
    raise http.error_for_status(status, f"{LABEL} HTTP {status} {rpc}: {message}".replace("  ", " "), create=create, delay=delay)


def _post(job: ResolvedJob, path: str, body: dict) -> dict:
    response = http.send("POST", f"{_base(job)}{path}", create=True, label=LABEL, json=body, headers=_headers(job))
    _raise_for_status(response, create=True)
    return http.json_body(response, create=True, label=LABEL)


def _model_path(model: str) -> str:
    model = model.removeprefix("models/")
    if not OPERATION.match(model) or ".." in model:
        raise PermanentError(f"{LABEL}: unusable model id {model[:60]!r}")
    return f"/models/{model}"


# --- submit ---------------------------------------------------------------------------


def submit(job: ResolvedJob) -> Finished | Submitted:
    handler = {"image": _image, "text": _text, "video": _video}.get(job.kind)
    if handler is None:
        raise PermanentError(f"{LABEL} does not generate {job.kind} here")
    return handler(job)


def _reference_parts(job: ResolvedJob) -> list:
    parts = []
    for reference in job.references[:14]:
        data, content_type = http.reference_bytes(reference, label=LABEL)
        parts.append({"inlineData": {"mimeType": content_type, "data": base64.b64encode(data).decode()}})
    return parts


def _image(job: ResolvedJob) -> Finished:
    model = job.model or "gemini-3.1-flash-image-preview"
    image_config = {}
    if RATIO.match(job.aspect_ratio or ""):
        image_config["aspectRatio"] = job.aspect_ratio
    size = job.resolution if IMAGE_SIZE.match(job.resolution or "") else job.quality
    if IMAGE_SIZE.match(size or "") and not model.startswith("gemini-2.5-flash-image"):
        image_config["imageSize"] = size.upper()  # uppercase K: "4k" is refused
    generation = {"responseModalities": ["IMAGE"]}
    if image_config:
        generation["imageConfig"] = image_config
    body = {
        "contents": [{"role": "user", "parts": [{"text": job.prompt}, *_reference_parts(job)]}],
        "generationConfig": generation,
    }
    if job.system_prompt:
        body["systemInstruction"] = {"parts": [{"text": job.system_prompt}]}
    reply = _post(job, f"{_model_path(model)}:generateContent", body)
    images, texts, finish, finish_message = _read_candidates(reply)
    if images:
        return Finished(outputs=http.with_roles(job, images), usage=_usage(reply))
    _raise_for_finish(finish, finish_message)
    said = f": the model said {http.short(' '.join(texts), 200)!r}" if texts else ""
    raise PermanentError(f"{LABEL} returned no image{said}")


def _usage(reply: dict) -> dict:
    """`usageMetadata`: the tokens Gemini billed (prompt and candidates)."""
    meta = reply.get("usageMetadata") if isinstance(reply.get("usageMetadata"), dict) else {}
    tokens_in, tokens_out = meta.get("promptTokenCount"), meta.get("candidatesTokenCount")
    if isinstance(tokens_in, int) and isinstance(tokens_out, int):
        return {"input_tokens": tokens_in, "output_tokens": tokens_out}
    return {}


def _text(job: ResolvedJob) -> Finished:
    generation = {}
    if job.max_tokens:
        generation["maxOutputTokens"] = job.max_tokens
    if job.temperature is not None:
        generation["temperature"] = job.temperature
    body = {"contents": [{"role": "user", "parts": [{"text": job.prompt}]}]}
    if generation:
        body["generationConfig"] = generation
    if job.system_prompt:
        body["systemInstruction"] = {"parts": [{"text": job.system_prompt}]}
    reply = _post(job, f"{_model_path(job.model or 'gemini-2.5-flash')}:generateContent", body)
    _, texts, finish, finish_message = _read_candidates(reply)
    text = "".join(texts)
    if text.strip():
        return Finished(outputs=[Output(kind="text", text=text, content_type="text/plain")], usage=_usage(reply))
    _raise_for_finish(finish, finish_message)
    raise PermanentError(f"{LABEL} returned no text (finish reason {finish or 'none'})")


def _read_candidates(reply: dict):
    """(images, texts, finish reason, finish message); raises for a blocked prompt."""
    feedback = reply.get("promptFeedback") or {}
    if isinstance(feedback, dict) and feedback.get("blockReason"):
        message = feedback.get("blockReasonMessage")
        raise PermanentError(
            f"{LABEL} blocked the prompt ({feedback['blockReason']}){': ' + http.short(message) if message else ''}"
        )
    images, texts, finish, finish_message = [], [], "", ""
    for candidate in reply.get("candidates") or []:
        if not isinstance(candidate, dict):
            continue
        finish = candidate.get("finishReason") or finish
        finish_message = candidate.get("finishMessage") or finish_message
        for part in (candidate.get("content") or {}).get("parts") or []:
            if not isinstance(part, dict) or part.get("thought"):
                continue
            inline = part.get("inlineData") or part.get("inline_data")
            if isinstance(inline, dict) and inline.get("data"):
                content_type = inline.get("mimeType") or inline.get("mime_type") or "image/png"
                data = http.decode_b64(inline["data"], label=LABEL)
                images.append(Output(kind=http.kind_of(content_type, "image"), data=data, content_type=content_type))
            elif isinstance(part.get("text"), str):
                texts.append(part["text"])
    return images, texts, finish, finish_message


def _raise_for_finish(finish: str, message: str) -> None:
    detail = f": {http.short(message)}" if message else ""
    if finish in BLOCK_FINISH:
        raise PermanentError(f"{LABEL} stopped the output for safety ({finish}){detail}")
    if finish in RETRY_FINISH:
        raise TransientError(f"{LABEL} produced nothing this time ({finish}){detail}")


def _video(job: ResolvedJob) -> Submitted:
    model = job.model or "veo-3.1-generate-preview"
    instance = {"prompt": job.prompt}
    if job.references:
        data, content_type = http.reference_bytes(job.references[0], label=LABEL)
        instance["image"] = {"inlineData": {"mimeType": content_type, "data": base64.b64encode(data).decode()}}
    parameters = {}
    if job.aspect_ratio in ("16:9", "9:16"):
        parameters["aspectRatio"] = job.aspect_ratio
    if job.duration:
        parameters["durationSeconds"] = job.duration
    if job.resolution:
        parameters["resolution"] = job.resolution
    reply = _post(job, f"{_model_path(model)}:predictLongRunning", {"instances": [instance], "parameters": parameters})
    name = reply.get("name")
    if not isinstance(name, str) or not name:
        raise http.AmbiguousError(f"{LABEL} accepted the video request but sent no operation name")
    return Submitted(task_id=name)


# --- check (Veo operations) ---------------------------------------------------------


def check(task_id: str, job: ResolvedJob) -> Running | Finished | Failed:
    if not OPERATION.match(task_id or "") or ".." in task_id or len(task_id) > 500:
        return Failed(reason=f"{LABEL}: unusable operation name {task_id[:60]!r}")
    response = http.send("GET", f"{_base(job)}/{task_id}", create=False, label=LABEL, headers=_headers(job))
    if response.status_code == 404:
        return Failed(reason=f"{LABEL} no longer knows operation {task_id[-40:]} (404: expired or deleted)")
    _raise_for_status(response, create=False)
    body = http.json_body(response, create=False, label=LABEL)
    if not body.get("done"):
        return Running()
    error = body.get("error")
    if isinstance(error, dict) and error:
        reason = f"{LABEL} video failed: {http.short(error.get('message') or error.get('status') or 'no reason given')}"
        return Failed(reason=reason, permanent=error.get("code") not in RETRYABLE_RPC_CODES)
    result = ((body.get("response") or {}).get("generateVideoResponse")) or {}
    outputs = []
    for sample in result.get("generatedSamples") or []:
        uri = ((sample or {}).get("video") or {}).get("uri")
        if uri:
            outputs.append(Output(kind="video", url=uri, content_type="video/mp4", headers={"x-goog-api-key": job.api_key}))
    if outputs:
        return Finished(outputs=outputs)
    filtered = result.get("raiMediaFilteredReasons") or []
    if filtered:
        return Failed(reason=f"{LABEL} withheld the video for safety: {http.short('; '.join(map(str, filtered)))}")
    return Failed(reason=f"{LABEL} finished the operation without a video")
