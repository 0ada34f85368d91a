"""Replicate predictions: asynchronous (201 on create, then `GET /predictions/{id}`).

Shapes: ../shared/providers/replicate.md. Quirks handled here:
- `version` may be `owner/name`, `owner/name:<version>` or a bare version id — all go to
  `POST /v1/predictions`;
- statuses `starting`/`processing` (keep polling), `succeeded`, `failed`, `canceled`
  and `aborted` (a deadline passed before it started; Remix forgot this one);
- `output` is a URL string, an array of URLs (every one is kept), an object with URLs,
  or — for language models — a list of text tokens (joined);
- a success with an empty output is a failure (NSFW checkers drop images that way);
- outputs are deleted after an hour (`data_removed`): downloaded at once;
- `failed` errors are free text: content-filter words are permanent, input validation
  is permanent, anything else is worth one fresh submission;
- a prediction echoes only `input` and `created_at`: a lost submission is found again in
  the list by those (`find_submitted`).
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

DEFAULT_BASE = "https://api.replicate.com/v1"
POLL_SECONDS = None  # the default 30 s cycle
# "Other endpoints: 3000 requests per minute" (replicate.com/docs/topics/predictions/rate-limits).
STATUS_PER_MINUTE = 3000
# `GET /v1/predictions` lists the account's predictions, newest first, 100 a page: one
# request reports on up to a hundred detached tasks (check_page).
STATUS_BATCH = 100
LABEL = "Replicate"

CONTENT_FILTER_WORDS = ("nsfw", "sensitive", "e005", "content policy", "safety", "flagged")
DEAD_STATUSES = {"canceled", "aborted"}
RUNNING_STATUSES = {"starting", "processing"}
OWN_PARAMS = {"layered"}
RESET_IN = re.compile(r"resets in ~?(\d+(?:\.\d+)?)\s*s", re.IGNORECASE)


def _base(job: ResolvedJob) -> str:
    return (job.base_url or DEFAULT_BASE).rstrip("/")


def _headers(job: ResolvedJob) -> dict:
    return {"Authorization": f"Bearer {job.api_key}", "Content-Type": "application/json"}


def _raise_for_status(response, *, create: bool) -> None:
    if response.status_code < 400:
        return
    problem = http.error_body(response)
    status = response.status_code
    title, detail = str(problem.get("title") or ""), str(problem.get("detail") or response.reason or "")
    message = f"{LABEL} HTTP {status}: {http.short(' — '.join(part for part in (title, detail) if part))}"
    if status == 402:
        raise AccountError(f"{message} — add credit to the account")
    delay = http.retry_delay(response.headers)
    if status == 429 and delay is None:
        hint = RESET_IN.search(detail)
        reset = response.headers.get("ratelimit-reset")
        if hint:
            delay = float(hint.group(1))
        elif reset and reset.replace(".", "", 1).isdigit():
            delay = float(reset)
    raise http.error_for_status(status, message, create=create, delay=delay)


def _input(job: ResolvedJob) -> dict:
    from queue_app.providers.catalogue import model_spec

    spec = model_spec("replicate", job.model)
    extra = spec.extra if spec else {}
    data = {"prompt": job.prompt}
    if job.aspect_ratio:
        data["aspect_ratio"] = job.aspect_ratio
    if job.resolution:
        data["resolution"] = job.resolution
    if job.duration:
        data["duration"] = job.duration
    if job.format and job.kind == "image":
        data["output_format"] = job.format
    if job.kind == "text":
        if job.system_prompt:
            data["system_prompt"] = job.system_prompt
        if job.max_tokens:
            data["max_tokens"] = job.max_tokens
        if job.temperature is not None:
            data["temperature"] = job.temperature
    if job.references:
        field = extra.get("reference_field") or ("image" if job.kind == "video" else "input_images")
        data[field] = job.references[0] if field == "image" else list(job.references)
    data.update({key: value for key, value in job.params.items() if key not in OWN_PARAMS})
    return data


def _urls(value) -> list[str]:
    if isinstance(value, str):
        return [value] if value.startswith(("https://", "http://")) else []
    if isinstance(value, list):
        return [url for item in value for url in _urls(item)]
    if isinstance(value, dict):
        return [url for item in value.values() for url in _urls(item)]
    return []


def _download_headers(job: ResolvedJob, url: str) -> dict:
    # Remix sends the token with the download; only ever to Replicate's own hosts.
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host.endswith((".replicate.delivery", ".replicate.com")) or host in ("replicate.delivery", "replicate.com"):
        return {"Authorization": f"Bearer {job.api_key}"}
    return {}


def _state(prediction: dict, job: ResolvedJob) -> Running | Finished | Failed:
    status = str(prediction.get("status") or "").lower()
    prediction_id = str(prediction.get("id") or "")[:40]
    if status in RUNNING_STATUSES or not status:
        return Running()
    if status in DEAD_STATUSES:
        return Failed(reason=f"{LABEL} prediction {prediction_id} was {status}")
    if status == "failed":
        error = http.short(prediction.get("error") or "no reason given")
        lowered = error.lower()
        if any(word in lowered for word in CONTENT_FILTER_WORDS):
            return Failed(reason=f"{LABEL} refused the content: {error}")
        if "input validation" in lowered or "invalid input" in lowered:
            return Failed(reason=f"{LABEL} rejected the input: {error}")
        return Failed(reason=f"{LABEL} prediction failed: {error}", permanent=False)
    if status != "succeeded":
        return Running()  # a status we do not know: keep polling, bounded by the timeout
    if prediction.get("data_removed"):
        return Failed(reason=f"{LABEL} already deleted the outputs of prediction {prediction_id} (kept for one hour)")
    output = prediction.get("output")
    if job.kind == "text":
        text = "".join(output) if isinstance(output, list) else output if isinstance(output, str) else ""
        if not str(text).strip():
            return Failed(reason=f"{LABEL} prediction succeeded without any text")
        return Finished(outputs=[Output(kind="text", text=str(text), content_type="text/plain")], usage=_usage(prediction))
    outputs = []
    for url in _urls(output):
        content_type = http.content_type_for(url)
        outputs.append(
            Output(
                kind=http.kind_of(content_type, job.kind if job.kind != "text" else "image"),
                url=url,
                content_type=content_type,
                headers=_download_headers(job, url),
            )
        )
    if not outputs:
        return Failed(reason=f"{LABEL} prediction succeeded without any output (possibly filtered)")
    return Finished(outputs=http.with_roles(job, outputs), usage=_usage(prediction))


def _usage(prediction: dict) -> dict:
    """`metrics.predict_time`: the seconds Replicate bills hardware-priced models for."""
    seconds = (prediction.get("metrics") or {}).get("predict_time")
    return {"predict_time": seconds} if isinstance(seconds, int | float) and not isinstance(seconds, bool) else {}


def submit(job: ResolvedJob) -> Finished | Submitted:
    if not job.model:
        raise PermanentError(f"{LABEL}: no model given")
    headers = _headers(job)
    wait = int(job.options.get("wait_seconds", 0) or 0)
    timeout = None
    if wait:
        headers["Prefer"] = f"wait={max(1, min(60, wait))}"
        timeout = (10, min(60, wait) + 30)
    body = {"version": job.model, "input": _input(job)}
    url = f"{_base(job)}/predictions"
    response = http.send("POST", url, create=True, label=LABEL, json=body, headers=headers, timeout=timeout)
    _raise_for_status(response, create=True)
    prediction = http.json_body(response, create=True, label=LABEL)
    if not prediction.get("id"):
        raise AmbiguousError(f"{LABEL} accepted the prediction but sent no id")
    state = _state(prediction, job)
    if isinstance(state, Finished):
        return state
    if isinstance(state, Failed):
        raise PermanentError(state.reason) if state.permanent else http.TransientError(state.reason)
    return Submitted(task_id=str(prediction["id"]))


def check(task_id: str, job: ResolvedJob) -> Running | Finished | Failed:
    response = http.send(
        "GET", f"{_base(job)}/predictions/{http.segment(task_id)}", create=False, label=LABEL, headers=_headers(job)
    )
    if response.status_code == 404:
        return Failed(reason=f"{LABEL} no longer knows prediction {task_id[:40]} (404: expired or deleted)")
    _raise_for_status(response, create=False)
    return _state(http.json_body(response, create=False, label=LABEL), job)


def check_page(cursor: str, job: ResolvedJob) -> tuple[dict, str]:
    """One page of `GET /v1/predictions` (newest first): ({prediction id: Running} for the
    ones still running, the next page's cursor or ""). A finished prediction is left out:
    the caller checks it on its own (`check`), which reads its outputs and failure the
    way a single check does."""
    from urllib.parse import urlencode

    url = f"{_base(job)}/predictions"
    query = f"?{urlencode({'cursor': cursor})}" if cursor else ""
    response = http.send("GET", url + query, create=False, label=LABEL, headers=_headers(job))
    _raise_for_status(response, create=False)
    body = http.json_body(response, create=False, label=LABEL)
    running = {}
    for prediction in body.get("results") or []:
        if isinstance(prediction, dict) and prediction.get("id"):
            if str(prediction.get("status") or "").lower() in RUNNING_STATUSES:
                running[str(prediction["id"])] = Running()
    return running, _cursor(body.get("next"), url)


LOOKUP_PAGES = 5  # newest first: 500 predictions back is far beyond any ambiguous window


def find_submitted(job: ResolvedJob, tag: str = "", since=None) -> list[str]:
    """The predictions created at or after `since` (an aware datetime) whose model and
    input are this job's — what an earlier submission of it may have created — newest
    first. References are left out of the match (they may be sent re-signed). A failed
    read raises: the caller must not pay again blind."""
    from dataclasses import replace
    from urllib.parse import urlencode

    wanted = _input(replace(job, references=[]))
    url, cursor, found = f"{_base(job)}/predictions", "", []
    for _ in range(LOOKUP_PAGES):
        query = f"?{urlencode({'cursor': cursor})}" if cursor else ""
        response = http.send("GET", url + query, create=False, label=LABEL, headers=_headers(job))
        _raise_for_status(response, create=False)
        body = http.json_body(response, create=False, label=LABEL)
        older = False
        for prediction in body.get("results") or []:
            if not isinstance(prediction, dict) or not prediction.get("id"):
                continue
            created = _created(prediction)
            if since is not None and created is not None and created < since:
                older = True
                continue
            if _same_model(prediction, job.model) and _same_input(prediction.get("input"), wanted):
                found.append(str(prediction["id"]))
        cursor = _cursor(body.get("next"), url)
        if older or not cursor:
            break
    return found


def _created(prediction: dict):
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(prediction.get("created_at") or "").replace("Z", "+00:00"))
    except ValueError:
        return None


def _same_model(prediction: dict, model: str) -> bool:
    name, _, version = model.partition(":")
    if "/" not in name:  # a bare version id
        return prediction.get("version") in (None, name)
    return prediction.get("model") in (None, name) and (not version or prediction.get("version") in (None, version))


def _same_input(echoed, wanted: dict) -> bool:
    return isinstance(echoed, dict) and all(echoed.get(key) == value for key, value in wanted.items())


def _cursor(next_url, base_url: str) -> str:
    # Only the cursor is taken from `next`: the request goes to our own base URL, never
    # to a host an answer names.
    from urllib.parse import parse_qs, urlsplit

    if not isinstance(next_url, str) or not next_url:
        return ""
    parts = urlsplit(next_url)
    if parts.netloc and parts.netloc != urlsplit(base_url).netloc:
        return ""
    return (parse_qs(parts.query).get("cursor") or [""])[0][:500]


def cancel(task_id: str, job: ResolvedJob) -> None:
    """Cancel a prediction (`POST /v1/predictions/{id}/cancel`); a finished or unknown
    one is left as it is (404 is fine: nothing runs any more)."""
    url = f"{_base(job)}/predictions/{http.segment(task_id)}/cancel"
    response = http.send("POST", url, create=False, label=LABEL, headers=_headers(job))
    if response.status_code != 404:
        _raise_for_status(response, create=False)
