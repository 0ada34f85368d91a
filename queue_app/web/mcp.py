"""The MCP endpoint at /mcp: Streamable HTTP, JSON-RPC 2.0, the personal API token.

A small view rather than the `mcp` package: the tools (mcp_tools.py) call the same
selectors and services as the JSON API, and the transport needs only POST with JSON
answers (GET and DELETE answer 405). It follows the specification (2025-06-18, with
2025-11-25 offered): every failure is a JSON-RPC error, an `Origin` must be ours or
allowed (DNS rebinding), an unknown `MCP-Protocol-Version` answers 400, a posted
notification 202, and a 401 points at /.well-known/oauth-protected-resource (RFC 9728).
Album outputs are resources (mcp_resources.py); answers hold what the client's version
defines (mcp_versions.py).
"""

import asyncio
import json
import logging
import time
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from queue_app.selectors.jobs import jobs_by_status
from queue_app.services.errors import ServiceError
from queue_app.web import api, mcp_kit, mcp_resources, mcp_tools, mcp_versions, refusals, schemas, tokens

log = logging.getLogger(__name__)

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
SERVER_INFO = {"name": "remix-studio-queue", "version": "1.1"}

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
RESOURCE_NOT_FOUND = -32002
COMPACT = {"separators": (",", ":")}  # a model reads every byte of tools/list
RESOURCE_METHODS = ("resources/list", "resources/templates/list", "resources/read")

# The tools as MCP lists them. Another module may append a tool here (a dict with
# inputSchema) with its handler in HANDLERS (user, arguments dict) -> dict.
TOOLS = mcp_kit.described_once([tool.describe() for tool in mcp_tools.TOOLS])
HANDLERS = {}


class RpcError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def tool_result(structured: dict, extra_content=()) -> dict:
    return {
        "content": [{"type": "text", "text": json.dumps(structured)}, *extra_content],
        "structuredContent": structured,
        "isError": False,
    }


def tool_refusal(refusal: ServiceError) -> dict:
    # A tool's refusal is a result the model can read, not a protocol error: the text for
    # people (with the HTTP status it would have on the JSON API), and the same refusal as
    # {code, message, retriable, status, field?} for a program to branch on.
    text = refusal.message if refusal.code == 400 else f"{refusal.message} ({refusal.code})"
    return {"content": [{"type": "text", "text": text}], "structuredContent": refusals.describe(refusal), "isError": True}


def call_tool(request, user, params: dict) -> dict:
    name = params.get("name")
    args = params.get("arguments")
    args = {} if args is None else args
    if not isinstance(name, str) or (name not in mcp_tools.BY_NAME and name not in HANDLERS):
        raise RpcError(INVALID_PARAMS, f"unknown tool: {str(name)[:100]}")
    if not isinstance(args, dict):
        raise RpcError(INVALID_PARAMS, "arguments must be an object")
    ctx = mcp_tools.Context(user=user, base_url=f"{request.scheme}://{request.get_host()}")
    try:
        if name in mcp_tools.BY_NAME:
            structured = mcp_tools.call(mcp_tools.BY_NAME[name], ctx, args)
        else:
            structured = json.loads(json.dumps(HANDLERS[name](user, args), cls=DjangoJSONEncoder))
    except ServiceError as refusal:
        return tool_refusal(refusal)
    log.info("mcp tool %s called by user %s", name, user.pk)
    if name == "start_jobs" and args.get("wait") is True and not getattr(request, "mcp_streams", False):
        structured = {**structured, "poll": POLL}
    return tool_result(structured, ctx.extra_content)


POLL = (
    "not waited: this client accepts only application/json, so the jobs' progress cannot be streamed; "
    "poll list_jobs or get_job for the started jobs (or call again accepting text/event-stream)"
)


def handle(request, user, message: dict):
    """The result of one JSON-RPC request."""
    method = message["method"]
    params = message.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object")
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0],
            "capabilities": {"tools": {"listChanged": False}, "resources": {"listChanged": False, "subscribe": False}},
            "serverInfo": SERVER_INFO,
            "instructions": "Tools to operate the Remix Studio generation queue: set up provider records and projects, "
            "ask project_options what a project's drafts can set, create drafts, start them (wait: true streams "
            "progress), and read each output through resources/read or its download_url. Refusals carry "
            "{code, message, retriable, field} in structuredContent.",
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        return call_tool(request, user, params)
    if method in RESOURCE_METHODS:
        try:
            return mcp_resources.handle(method, user, f"{request.scheme}://{request.get_host()}", params)
        except ServiceError as refusal:
            raise RpcError(RESOURCE_NOT_FOUND if refusal.code == 404 else INVALID_PARAMS, refusal.message) from None
    raise RpcError(METHOD_NOT_FOUND, f"method not found: {method[:100]}")


def rpc_error(request_id, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def refuse(status: int, code: int, message: str, request_id=None) -> JsonResponse:
    return JsonResponse(rpc_error(request_id, code, message), status=status)


def accepted() -> HttpResponse:
    response = HttpResponse(status=202)
    del response["Content-Type"]  # no body, so no type (never text/html)
    return response


def resource_metadata_url(request) -> str:
    return f"{request.scheme}://{request.get_host()}/.well-known/oauth-protected-resource"


def origin_allowed(request) -> bool:
    origin = request.headers.get("Origin")
    if not origin:
        return True  # not a browser: DNS rebinding needs one
    allowed = set(getattr(settings, "MCP_ALLOWED_ORIGINS", ()))
    if origin in allowed:
        return True
    parts = urlsplit(origin)
    return bool(parts.netloc) and parts.netloc == request.get_host() and parts.scheme in ("http", "https")


def classify(item) -> str:
    """request | notification | response | invalid"""
    if not isinstance(item, dict) or item.get("jsonrpc") != "2.0":
        return "invalid"
    if "method" in item:
        if not isinstance(item["method"], str):
            return "invalid"
        if "id" not in item:
            return "notification"
        return "request" if isinstance(item["id"], str | int) and not isinstance(item["id"], bool) else "invalid"
    if "id" in item and ("result" in item) != ("error" in item):
        return "response"
    return "invalid"


def read_message(request):
    return schemas.parse_json(api.bounded_body(request, noun="message"))


@csrf_exempt
def mcp_view(request):
    if not origin_allowed(request):
        return refuse(403, INVALID_REQUEST, "origin not allowed")
    if request.method != "POST":
        response = refuse(405, INVALID_REQUEST, f"method {request.method} not allowed: POST JSON-RPC messages")
        response["Allow"] = "POST"
        return response
    version = request.headers.get("MCP-Protocol-Version")
    if version is not None and version not in PROTOCOL_VERSIONS:
        return refuse(400, INVALID_REQUEST, f"unsupported MCP-Protocol-Version; supported: {', '.join(PROTOCOL_VERSIONS)}")
    user = tokens.user_for_token(tokens.bearer(request) or "")
    if user is None:
        response = refuse(401, -32001, "authentication required: Authorization: Bearer <API token>")
        response["WWW-Authenticate"] = f'Bearer realm="mcp", resource_metadata="{resource_metadata_url(request)}"'
        return response
    try:
        message = read_message(request)
    except schemas.SchemaError as error:
        return refuse(error.code, PARSE_ERROR if error.code == 400 else INVALID_REQUEST, error.message)
    version = mcp_versions.version_of(request, PROTOCOL_VERSIONS)
    if version is None:
        return refuse(404, INVALID_REQUEST, "unknown Mcp-Session-Id: initialize again")
    if wants_watch(request, message):
        return start_and_watch(request, user, message, version)
    batch = isinstance(message, list)
    if batch and not message:
        return refuse(400, INVALID_REQUEST, "an empty batch is not a request")
    replies, session = [], None
    for item in message if batch else [message]:
        kind = classify(item)
        if kind == "invalid":
            request_id = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str | int) else None
            replies.append(rpc_error(request_id, INVALID_REQUEST, "invalid request"))
            continue
        if kind == "response":
            continue  # we send no requests, so there is nothing to match; accepted
        try:
            result = handle(request, user, item)
            if item["method"] == "initialize":
                version = result["protocolVersion"]  # what the rest of this exchange speaks
                session = mcp_versions.session_for(version)
            if kind == "request":
                result = mcp_versions.shaped(item["method"], result, version)
                replies.append({"jsonrpc": "2.0", "id": item["id"], "result": result})
        except RpcError as failure:
            if kind == "request":
                replies.append(rpc_error(item["id"], failure.code, failure.message))
        except Exception:
            log.exception("mcp %s failed", item["method"][:100])
            if kind == "request":
                replies.append(rpc_error(item["id"], INTERNAL_ERROR, "internal error"))
    if not replies:
        return accepted()  # notifications and responses only
    reply = replies if batch else replies[0]
    response = JsonResponse(reply, safe=False, encoder=DjangoJSONEncoder, json_dumps_params=COMPACT)
    if session:
        response["Mcp-Session-Id"] = session
    return response


# --- start_jobs with wait: progress over SSE until the jobs finish ------------------------

WATCH_INTERVAL = 1.0
FINISHED = ("completed", "failed")


def wants_watch(request, message) -> bool:
    if classify(message) != "request" or message["method"] != "tools/call":
        return False
    params = message.get("params")
    if not isinstance(params, dict) or params.get("name") != "start_jobs":
        return False
    arguments = params.get("arguments")
    accepts = request.headers.get("Accept", "")
    return isinstance(arguments, dict) and arguments.get("wait") is True and "text/event-stream" in accepts


def sse(message: dict) -> str:
    return f"event: message\ndata: {json.dumps(message, cls=DjangoJSONEncoder)}\n\n"


def start_and_watch(request, user, message, version: str):
    """Start the jobs now; then answer with an SSE stream: a progress notification each
    time a started job finishes (when the request carries a progressToken), and the
    tool's result last, with the jobs per status and whether the wait timed out."""
    request.mcp_streams = True
    try:
        result = mcp_versions.shaped("tools/call", handle(request, user, message), version)
    except RpcError as failure:
        return JsonResponse(rpc_error(message["id"], failure.code, failure.message))
    if result["isError"]:
        return JsonResponse({"jsonrpc": "2.0", "id": message["id"], "result": result})
    params = message["params"]
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    token = meta.get("progressToken")
    token = token if isinstance(token, str | int) and not isinstance(token, bool) else None
    seconds = params["arguments"].get("wait_seconds", 120)
    started = json.loads(result["content"][0]["text"])  # structuredContent too, for versions that have it
    stream = watch(message["id"], started, token, seconds, version)
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response


async def watch(request_id, started: dict, token, seconds: float, version: str):
    job_ids = started["started"]
    total = len(job_ids)
    deadline = time.monotonic() + seconds
    last = None
    while True:
        counts = await sync_to_async(jobs_by_status)(job_ids)
        done = sum(counts.get(status, 0) for status in FINISHED)
        if token is not None and done != last:
            text = f"{done} of {total} finished ({counts.get('failed', 0)} failed)"
            progress = {"progressToken": token, "progress": done, "total": total, "message": text}
            yield sse({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
            last = done
        if done >= total or time.monotonic() >= deadline:
            break
        await asyncio.sleep(WATCH_INTERVAL)
    structured = {**started, "finished": counts, "timed_out": done < total}
    result = mcp_versions.shaped("tools/call", tool_result(structured), version)
    yield sse({"jsonrpc": "2.0", "id": request_id, "result": result})


def protected_resource_metadata(request):
    """RFC 9728: what protects /mcp, as tokens are really issued: a personal API token made
    on the account page (resource_documentation), sent as a Bearer header. No OAuth
    authorization server issues them, so none is listed (an empty list would claim one)."""
    base = f"{request.scheme}://{request.get_host()}"
    response = JsonResponse(
        {
            "resource": f"{base}/mcp",
            "bearer_methods_supported": ["header"],
            "resource_name": "Remix Studio Queue",
            "resource_documentation": f"{base}/account/",
        }
    )
    response["Access-Control-Allow-Origin"] = "*"
    return response
