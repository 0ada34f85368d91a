"""RunningHub: standard-model endpoints, AI apps and ComfyUI workflows — asynchronous
(a `taskId`, polled with `POST /query`).

Shapes: ../shared/providers/runninghub.md. Quirks handled here:
- errors usually arrive as HTTP 200 with a non-empty `errorCode` (a string) and
  `errorMessage` (v2), or a `code`/`msg` envelope with `code != 0` (v1) — both are read;
- the code table sorts codes into permanent (parameters, auth, balance, moderation),
  transient (capacity, server flukes), "still running" (804/813) and "task dead"
  (805/807/1004/423); a code we do not know is permanent on submit (we might be paying
  for a loop) and tolerated while polling;
- moderation words in `errorMessage` are permanent whatever the code says;
- a submit can already be SUCCESS with its results;
- `results[]` holds one entry per output file (a video and its cover too): all kept, in order;
- one host per provider record (the `.cn` and `.ai` keys are not interchangeable).
"""

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
    TransientError,
)

DEFAULT_BASE = "https://www.runninghub.ai/openapi/v2"
POLL_SECONDS = None  # the default 30 s cycle
# RunningHub limits concurrent tasks per key, not requests a minute: the budget module's
# default for an unpublished limit.
STATUS_PER_MINUTE = None
LABEL = "RunningHub"

PERMANENT_CODES = {
    "301", "1007", "380", "901", "1001", "412", "433", "803", "1101", "802", "801", "811", "1002", "1014",
    "416", "812", "1501", "1505", "809", "1008", "1013", "810",
}  # fmt: skip
TRANSIENT_CODES = {
    "421", "415", "1520", "1003", "1011", "500", "1000", "1005", "1010", "1012", "1006", "1015", "1504", "808", "814",
}  # fmt: skip
RUNNING_CODES = {"804", "813"}
DEAD_CODES = {"805", "807", "1004", "423"}
MODERATION_CODES = {"1501", "1505"}
BALANCE_CODES = {"416", "812"}
# The key itself (802 APIKEY_UNAUTHORIZED, 811 CORPAPIKEY_INVALID): the account, not the job.
KEY_CODES = {"802", "811"}
MODERATION_WORDS = ("moderation", "nsfw", "violation", "forbidden", "sensitive", "content review", "prohibited", "审核", "违规")
RUNNING_STATUSES = {"CREATE", "QUEUED", "RUNNING"}
FAILED_STATUSES = {"FAILED", "CANCEL", "CANCELED", "CANCELLED"}
VIDEO_TYPES = {"mp4", "webm", "mov"}
OWN_PARAMS = {"layered", "workflow_id", "webapp_id", "node_info_list", "prompt_node", "instance_type", "endpoint"}


def _base(job: ResolvedJob) -> str:
    return (job.base_url or DEFAULT_BASE).rstrip("/")


def _headers(job: ResolvedJob) -> dict:
    return {"Authorization": f"Bearer {job.api_key}", "Content-Type": "application/json"}


def _moderated(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in MODERATION_WORDS)


def _read(body: dict) -> tuple[str, str, dict]:
    """(error code or '', message, the task object) from a v2 flat body or a v1 envelope."""
    if "code" in body and "taskId" not in body and "errorCode" not in body:
        code = str(body.get("code"))
        data = body.get("data")
        task = data if isinstance(data, dict) else {"status": data} if isinstance(data, str) else {}
        if code not in ("0", "None"):
            return code, str(body.get("msg") or ""), task
        if isinstance(data, list):  # v1 outputs: the list of files itself
            task = {"status": "SUCCESS", "results": data}
        if "taskStatus" in task and "status" not in task:
            task["status"] = task["taskStatus"]
        return "", "", task
    code = str(body.get("errorCode") or "")
    return ("" if code == "0" else code), str(body.get("errorMessage") or ""), body


def _error(code: str, message: str, *, delay: float | None = None):
    reason = f"{LABEL} error {code}: {http.short(message) or 'no message'}"
    if code in MODERATION_CODES or _moderated(message):
        return PermanentError(f"{LABEL} refused the content (moderation, {code}): {http.short(message)}")
    if code in BALANCE_CODES:
        return AccountError(reason + " — top up the account")
    if code in KEY_CODES:
        return AccountError(reason + " — check the API key")
    if code in TRANSIENT_CODES:
        return TransientError(reason, delay=delay)
    return PermanentError(reason)


def _failed_reason(task: dict) -> str:
    failed = task.get("failedReason")
    if isinstance(failed, dict):
        failed = failed.get("exception_message") or failed.get("exception_type") or ""
    parts = [str(task.get("errorMessage") or ""), str(failed or "")]
    return http.short(" — ".join(part for part in parts if part)) or "no reason given"


def _usage(task: dict) -> dict:
    """`usage.consumeCoins`: the RunningHub coins the task cost."""
    usage = task.get("usage") if isinstance(task.get("usage"), dict) else {}
    try:
        return {"charged": str(float(usage["consumeCoins"])), "currency": "coins"}
    except (KeyError, TypeError, ValueError):
        return {}


def _outputs(job: ResolvedJob, results) -> list[Output]:
    outputs, images_for_poster = [], []
    for item in results if isinstance(results, list) else []:
        if not isinstance(item, dict):
            continue
        url = item.get("url") or item.get("outputUrl") or item.get("fileUrl")
        kind_hint = str(item.get("outputType") or item.get("fileType") or "").lower().lstrip(".")
        if url:
            content_type = http.CONTENT_TYPES.get(kind_hint) or http.content_type_for(url)
            kind = http.kind_of(content_type, "image")
            outputs.append(Output(kind=kind, url=url, content_type=content_type))
            continue
        text = item.get("text") or item.get("content") or item.get("output")
        if isinstance(text, str) and text.strip():
            outputs.append(Output(kind="text", text=text, content_type="text/plain"))
    if job.kind == "video":
        # A video workflow that also saves an image: that image is the video's cover.
        videos = [output for output in outputs if output.kind == "video"]
        images_for_poster = [output for output in outputs if output.kind == "image"]
        if videos and images_for_poster:
            from dataclasses import replace

            outputs = [replace(videos[0], poster_url=images_for_poster[0].url), *videos[1:]]
    return http.with_roles(job, outputs)


# --- submit ---------------------------------------------------------------------------


def _target(job: ResolvedJob) -> tuple[str, dict]:
    from queue_app.providers.catalogue import model_spec

    params = job.params
    spec = model_spec("runninghub", job.model)
    is_graph = bool(spec and spec.extra.get("workflow"))
    workflow = params.get("workflow_id") or (job.options.get("workflow_id") if is_graph and job.model != "ai-app" else None)
    webapp = params.get("webapp_id") or (job.options.get("webapp_id") if job.model == "ai-app" else None)
    if workflow or webapp or is_graph:
        if not (workflow or webapp):
            raise PermanentError(f"{LABEL}: a workflow or AI app needs `workflow_id` / `webapp_id`")
        nodes = [dict(node) for node in params.get("node_info_list") or job.options.get("node_info_list") or []]
        prompt_node = params.get("prompt_node") or job.options.get("prompt_node")
        if isinstance(prompt_node, dict) and prompt_node.get("nodeId"):
            nodes.append(
                {
                    "nodeId": str(prompt_node["nodeId"]),
                    "fieldName": prompt_node.get("fieldName", "text"),
                    "fieldValue": job.prompt,
                }
            )
        body = {"nodeInfoList": nodes, "instanceType": params.get("instance_type") or "default", "usePersonalQueue": False}
        path = f"/run/workflow/{http.segment(str(workflow))}" if workflow else f"/run/ai-app/{http.segment(str(webapp))}"
        return path, body
    endpoint = params.get("endpoint") or job.model
    if job.references and spec and spec.extra.get("with_references"):
        endpoint = spec.extra["with_references"]
    if not endpoint or ".." in endpoint or endpoint.startswith("/"):
        raise PermanentError(f"{LABEL}: unusable endpoint {endpoint!r}")
    body = {"prompt": job.prompt}
    if job.aspect_ratio:
        body["aspectRatio"] = job.aspect_ratio
    if job.resolution:
        body["resolution"] = job.resolution
    if job.quality:
        body["quality"] = job.quality
    if job.duration:
        body["duration"] = job.duration
    if job.references:
        if job.kind == "video":
            body["imageUrl"] = job.references[0]
        else:
            body["imageUrls"] = list(job.references)
    body.update({key: value for key, value in params.items() if key not in OWN_PARAMS})
    return "/" + endpoint, body


def submit(job: ResolvedJob) -> Finished | Submitted:
    path, body = _target(job)
    response = http.send("POST", f"{_base(job)}{path}", create=True, label=LABEL, json=body, headers=_headers(job))
    if response.status_code >= 400:
        reply = http.error_body(response)
        code, message, _ = _read(reply) if reply else ("", "", {})
        if code:
            raise _error(code, message, delay=http.retry_delay(response.headers))
        raise http.error_for_status(
            response.status_code,
            f"{LABEL} HTTP {response.status_code}: {http.short(response.text, 200)}",
            create=True,
            delay=http.retry_delay(response.headers),
        )
    code, message, task = _read(http.json_body(response, create=True, label=LABEL))
    if code:
        raise _error(code, message)
    prompt_tips = task.get("promptTips")
    status = str(task.get("status") or "").upper()
    task_id = str(task.get("taskId") or task.get("task_id") or "")
    if status == "SUCCESS":
        outputs = _outputs(job, task.get("results"))
        if outputs:
            return Finished(outputs=outputs, usage=_usage(task))
    if status in FAILED_STATUSES:
        raise _error(str(task.get("errorCode") or "1015"), _failed_reason(task))
    if not task_id:
        if prompt_tips:
            raise PermanentError(f"{LABEL} refused the workflow inputs: {http.short(prompt_tips)}")
        raise AmbiguousError(f"{LABEL} answered without a task id; the task may have been created")
    return Submitted(task_id=task_id)


# --- check ----------------------------------------------------------------------------


def check(task_id: str, job: ResolvedJob) -> Running | Finished | Failed:
    http.segment(task_id)
    response = http.send(
        "POST", f"{_base(job)}/query", create=False, label=LABEL, json={"taskId": task_id}, headers=_headers(job)
    )
    if response.status_code == 404:
        return Failed(reason=f"{LABEL} no longer knows task {task_id} (404)")
    if response.status_code >= 400:
        raise TransientError(f"{LABEL} status check answered HTTP {response.status_code}")
    code, message, task = _read(http.json_body(response, create=False, label=LABEL))
    status = str(task.get("status") or "").upper()
    if status in FAILED_STATUSES or status == "SUCCESS":
        code = ""  # a terminal task: its errorCode describes the task, not this request
    if code in RUNNING_CODES:
        return Running()
    if code in DEAD_CODES:
        return Failed(reason=f"{LABEL} reports task {task_id} dead or unknown ({code}: {http.short(message)})")
    if code:
        error = _error(code, message)
        if isinstance(error, TransientError) or code not in PERMANENT_CODES:
            raise TransientError(f"{LABEL} status check: {error.reason}")
        raise error
    if status == "SUCCESS":
        outputs = _outputs(job, task.get("results"))
        if not outputs:
            return Failed(reason=f"{LABEL} task {task_id} succeeded without any output")
        return Finished(outputs=outputs, usage=_usage(task))
    if status in FAILED_STATUSES:
        failure_code = str(task.get("errorCode") or "")
        reason = f"{LABEL} task {'canceled' if status.startswith('CANCEL') else 'failed'}: {_failed_reason(task)}"
        # Server flukes (1000, 1015, …) are worth a fresh submission; moderation and
        # parameter errors are not, and neither is an unknown one (we would pay again).
        retry = failure_code in TRANSIENT_CODES and not _moderated(reason) and not status.startswith("CANCEL")
        return Failed(reason=reason, permanent=not retry)
    # CREATE / QUEUED / RUNNING, or a status we do not know: keep polling (bounded by
    # the processing timeout).
    return Running()


# --- cancel ---------------------------------------------------------------------------


def cancel(task_id: str, job: ResolvedJob) -> None:
    """Cancel a task: the v2 API has no cancel endpoint, so this is the OpenAPI one on the
    same host, `POST /task/openapi/cancel` with the key in the body ({"code": 0} = done)."""
    http.segment(task_id)
    base = _base(job)
    host = base[: -len("/openapi/v2")] if base.endswith("/openapi/v2") else base
    body = {"apiKey": job.api_key, "taskId": task_id}
    response = http.send("POST", f"{host}/task/openapi/cancel", create=False, label=LABEL, json=body, headers=_headers(job))
    if response.status_code >= 400:
        raise TransientError(f"{LABEL} cancel answered HTTP {response.status_code}")
    code, message, _ = _read(http.json_body(response, create=False, label=LABEL))
    if code:
        raise _error(code, message)
