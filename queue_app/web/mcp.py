"""The MCP endpoint: Streamable HTTP transport, JSON-RPC 2.0, at /mcp.

A small view rather than the `mcp` package: the tools are a handful of calls of the
same selector and services as the JSON API, and the transport needs only POST with JSON
answers (the spec lets a server answer a request with application/json instead of an
SSE stream; GET, for a server-initiated stream, answers 405). Authenticated by the
personal API token (`Authorization: Bearer rsq_…`), like the JSON API.

Tools: get_queue_status, clear_failed_jobs, retry_failed_jobs, create_drafts, start_jobs,
cancel_jobs.
"""

import json
import logging

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from queue_app import references, selectors, services
from queue_app.web import api, tokens

log = logging.getLogger(__name__)

PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")
SERVER_INFO = {"name": "remix-studio-queue", "version": "1.0"}

SCOPE_PROPERTIES = {
    "scope": {"type": "string", "enum": ["all", "project", "provider"], "description": "which failed jobs (default: all)"},
    "project_id": {"type": "integer", "description": "with scope=project"},
    "provider_id": {"type": "integer", "description": "with scope=provider"},
    "dry_run": {"type": "boolean", "description": "only count the jobs that would be affected"},
}

TOOLS = [
    {
        "name": "get_queue_status",
        "title": "Queue status",
        "description": "Totals of the generation queue (pending, processing, failed; Running, Detached, Queued, "
        "Waiting; active slots vs concurrency; oldest dispatchable job's age), optionally per project or provider. "
        "The same counts as the Queue Monitor.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "breakdown": {"type": "string", "enum": list(api.BREAKDOWNS), "default": "none"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
            },
        },
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "clear_failed_jobs",
        "title": "Clear failed jobs",
        "description": "Delete failed job records in one scope: everything you may see, a project, or a provider "
        "queue (project_id and provider_id are mutually exclusive). Album outputs are kept.",
        "inputSchema": {"type": "object", "properties": SCOPE_PROPERTIES},
        "annotations": {"destructiveHint": True},
    },
    {
        "name": "retry_failed_jobs",
        "title": "Retry failed jobs",
        "description": "Put failed jobs in one scope back in the queue.",
        "inputSchema": {"type": "object", "properties": SCOPE_PROPERTIES},
    },
    {
        "name": "create_drafts",
        "title": "Create drafts",
        "description": "Create `quantity` drafts of one prompt in a project (output settings optional); with "
        "per_line: true, `quantity` drafts of each non-blank line of the prompt.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "project_id": {"type": "integer"},
                "prompt": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1, "maximum": services.MAX_DRAFTS_PER_REQUEST, "default": 1},
                "per_line": {"type": "boolean", "default": False, "description": "one draft per non-blank line"},
                "provider_id": {"type": "integer", "description": "this draft's provider (default: the project's)"},
                "references": {
                    "type": "array",
                    "items": {"type": "string"},
                    "maxItems": references.MAX_REFERENCES,
                    "description": "reference images: ref:<sha256>, album:<id>, a data: URI or an https URL",
                },
                "settings": {"type": "object", "description": "model, aspect_ratio, quality, resolution, format, duration"},
            },
            "required": ["project_id", "prompt"],
        },
    },
    {
        "name": "start_jobs",
        "title": "Start jobs",
        "description": "Start selected drafts (job_ids) or all drafts of a project (all_drafts: true).",
        "inputSchema": {
            "type": "object",
            "properties": {
                "project_id": {"type": "integer"},
                "job_ids": {"type": "array", "items": {"type": "string"}},
                "all_drafts": {"type": "boolean"},
            },
            "required": ["project_id"],
        },
    },
    {
        "name": "cancel_jobs",
        "title": "Cancel jobs",
        "description": 'Cancel pending or processing jobs (job_ids): each fails at once with reason "cancelled"; '
        "a running call's result is discarded and a remote task is cancelled at the provider where its API can. "
        "Drafts and finished jobs are skipped. Cancelled jobs can be retried or cleared like failed ones.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "job_ids": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": services.MAX_DRAFTS_PER_REQUEST,
                }
            },
            "required": ["job_ids"],
        },
        "annotations": {"destructiveHint": True, "idempotentHint": True},
    },
]


class RpcError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def tool_get_queue_status(user, args: dict) -> dict:
    breakdown = args.get("breakdown") or "none"
    if breakdown not in api.BREAKDOWNS:
        raise services.ServiceError("breakdown must be none, projects, providers or all")
    limit = args.get("limit")
    limit = api.whole_number(limit, "limit", low=1, high=1000) if limit is not None else None
    return selectors.queue_status(user=user, breakdown=breakdown, limit=limit)


def tool_clear_failed_jobs(user, args: dict) -> dict:
    return api.failed_action(user, args, action="clear")


def tool_retry_failed_jobs(user, args: dict) -> dict:
    return api.failed_action(user, args, action="retry")


def tool_create_drafts(user, args: dict) -> dict:
    project = api.visible_project(user, args.get("project_id"))
    payload, _ = api.drafts_create(user, project, args)
    return payload


def tool_start_jobs(user, args: dict) -> dict:
    project = api.visible_project(user, args.get("project_id"))
    job_ids = api.uuid_list(args["job_ids"]) if args.get("job_ids") else None
    all_drafts = bool(args.get("all_drafts"))
    if not job_ids and not all_drafts:
        raise services.ServiceError("give job_ids or all_drafts: true")
    return services.jobs_start(user=project.owner, project=project, job_ids=job_ids, all_drafts=all_drafts)


def tool_cancel_jobs(user, args: dict) -> dict:
    return api.jobs_cancel(user, api.uuid_list(args.get("job_ids")))


HANDLERS = {
    "get_queue_status": tool_get_queue_status,
    "clear_failed_jobs": tool_clear_failed_jobs,
    "retry_failed_jobs": tool_retry_failed_jobs,
    "create_drafts": tool_create_drafts,
    "start_jobs": tool_start_jobs,
    "cancel_jobs": tool_cancel_jobs,
}


def call_tool(user, params: dict) -> dict:
    name = params.get("name")
    args = params.get("arguments") or {}
    if name not in HANDLERS:
        raise RpcError(-32602, f"unknown tool: {name}")
    if not isinstance(args, dict):
        raise RpcError(-32602, "arguments must be an object")
    try:
        result = HANDLERS[name](user, args)
    except services.ServiceError as refusal:
        # A tool's refusal is a result the model can read, not a protocol error.
        return {"content": [{"type": "text", "text": refusal.message}], "isError": True}
    structured = json.loads(json.dumps(result, cls=DjangoJSONEncoder))
    log.info("mcp tool %s called by user %s", name, user.pk)
    return {"content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured, "isError": False}


def handle(user, message: dict):
    """The result of one JSON-RPC request (None for a notification)."""
    method = message.get("method")
    params = message.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": SERVER_INFO,
            "instructions": "Tools to watch and operate the Remix Studio generation queue.",
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        return call_tool(user, params)
    raise RpcError(-32601, f"method not found: {method}")


def rpc_error(request_id, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


@csrf_exempt
def mcp_view(request):
    if request.method != "POST":
        response = HttpResponse(status=405)
        response["Allow"] = "POST"
        return response
    user = tokens.user_for_token(tokens.bearer(request) or "")
    if user is None:
        response = JsonResponse(rpc_error(None, -32001, "authentication required: Authorization: Bearer <API token>"), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="mcp"'
        return response
    try:
        message = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        return JsonResponse(rpc_error(None, -32700, "parse error"), status=400)
    batch = isinstance(message, list)
    replies = []
    for item in message if batch else [message]:
        if not isinstance(item, dict) or item.get("jsonrpc") != "2.0" or not isinstance(item.get("method"), str):
            replies.append(rpc_error(item.get("id") if isinstance(item, dict) else None, -32600, "invalid request"))
            continue
        is_notification = "id" not in item
        try:
            result = handle(user, item)
            if not is_notification:
                replies.append({"jsonrpc": "2.0", "id": item["id"], "result": result})
        except RpcError as failure:
            if not is_notification:
                replies.append(rpc_error(item["id"], failure.code, failure.message))
    if not replies:
        return HttpResponse(status=202)  # notifications only
    return JsonResponse(replies if batch else replies[0], safe=False, encoder=DjangoJSONEncoder)
