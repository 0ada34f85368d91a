"""The OpenAPI 3.1 document of the JSON API, at /api/openapi.json, generated from the
operation schemas in `queue_app.web.schemas` and `manage_schemas` (the models the views and
services take), so the document cannot drift from the handlers. Every route under /api/
is listed here; a test fails when one is not (tests/test_schemas.py)."""

from dataclasses import dataclass

from django.http import JsonResponse
from django.views.decorators.http import require_GET
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from queue_app.web import agent_schemas as A
from queue_app.web import batch_schemas as B
from queue_app.web import manage_schemas as M
from queue_app.web import schemas as S

ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string", "description": "what was refused and why, for people"},
        "code": {"type": "string", "description": "a stable word to branch on: not_found, invalid_argument, conflict…"},
        "retriable": {"type": "boolean", "description": "the same request may succeed later unchanged"},
        "status": {"type": "integer"},
        "field": {"type": "string", "description": "the argument the refusal is about, when one is"},
    },
    "required": ["error"],
}
ANY_OBJECT = {"type": "object"}
PATH_IDS = {
    "project_id": {"type": "integer", "minimum": 1, "maximum": S.MAX_ID},
    "provider_id": {"type": "integer", "minimum": 1, "maximum": S.MAX_ID},
    "job_id": {"type": "string", "format": "uuid"},
    "item_id": {"type": "integer", "minimum": 1, "maximum": S.MAX_ID},
    "name": {"type": "string", "minLength": 1, "maxLength": 60},
}
FILE = {"*/*": {"schema": {"type": "string", "format": "binary"}}}
REFUSALS = (
    (400, "the request does not fit the schema"),
    (401, "no or an invalid token"),
    (403, "refused (CSRF, storage limit, another user's row you may only see)"),
    (404, "not found, or not yours"),
    (405, "method not allowed"),
    (409, "the same Idempotency-Key is still running, or the row changed meanwhile"),
    (413, "the body is too large"),
    (415, "not the body type this operation takes"),
    (422, "the Idempotency-Key was used with another request"),
)


@dataclass(frozen=True)
class Op:
    path: str
    method: str
    id: str
    summary: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    status: int = 200
    result: type[BaseModel] | None = None
    idempotent: bool = False
    multipart: dict | None = None
    public: bool = False
    media: dict | None = None  # a response that is not JSON (a file)


OPERATIONS = [
    Op("/api/queue/status", "get", "queue_status", "Queue totals", query=S.QueueStatusQuery, result=A.QueueStatusOut),
    Op("/api/queue/clear-failed", "post", "clear_failed", "Clear failed jobs", S.FailedScope, result=S.FailedResult),
    Op("/api/queue/retry-failed", "post", "retry_failed", "Retry failed jobs", S.FailedScope, result=S.FailedResult),
    Op("/api/projects", "get", "list_projects", "Your projects", query=S.ProjectsQuery, result=A.ProjectList),
    Op(
        "/api/projects",
        "post",
        "create_project",
        "Create a project",
        M.ProjectCreate,
        status=201,
        result=A.ProjectOut,
        idempotent=True,
    ),
    Op("/api/projects/{project_id}", "get", "get_project", "A project, its footprint and storage", result=A.ProjectView),
    Op(
        "/api/projects/{project_id}",
        "patch",
        "update_project",
        "Change or archive a project",
        M.ProjectPatch,
        result=A.ProjectOut,
    ),
    Op("/api/projects/{project_id}", "delete", "delete_project", "Delete a project and what it holds"),
    Op(
        "/api/projects/{project_id}/estimate",
        "post",
        "estimate_start",
        "What starting these drafts (or all) would cost, per provider and currency; starts nothing",
        S.StartJobs,
        result=A.CostEstimate,
    ),
    Op(
        "/api/projects/{project_id}/drafts",
        "post",
        "create_drafts",
        "Create drafts",
        S.CreateDrafts,
        status=201,
        result=S.DraftsCreated,
        idempotent=True,
    ),
    Op(
        "/api/projects/{project_id}/start", "post", "start_jobs", "Start jobs", S.StartJobs, result=S.JobsStarted, idempotent=True
    ),
    Op("/api/projects/{project_id}/jobs", "get", "project_jobs", "A page of a project's jobs", query=S.ProjectJobsQuery),
    Op("/api/drafts/{job_id}", "patch", "update_draft", "Edit a draft (only the keys sent change)", M.DraftPatch),
    Op("/api/drafts/{job_id}", "delete", "delete_draft", "Delete a draft"),
    Op(
        "/api/references",
        "post",
        "upload_reference",
        "Upload a reference image (multipart); its ref: id goes in a draft's references",
        status=201,
        result=M.ReferenceUploaded,
        multipart=M.REFERENCE_UPLOAD,
    ),
    Op("/api/jobs/retry", "post", "retry_jobs", "Retry chosen failed jobs", S.RetryJobs, result=S.JobsRetried),
    Op("/api/jobs/cancel", "post", "cancel_jobs", "Cancel jobs", S.CancelJobs, result=S.JobsCancelled, idempotent=True),
    Op("/api/jobs/run-next", "post", "run_next_jobs", "Move pending jobs to the front", S.RunNextJobs, result=S.JobsRunNext),
    Op("/api/jobs/retry-now", "post", "retry_now", "End chosen jobs' retry backoff", S.RetryNow, result=S.JobsRetriedNow),
    Op(
        "/api/providers/{provider_id}/retry-now",
        "post",
        "provider_retry_now",
        "End the retry backoff of a provider's jobs",
        result=S.ProviderRetriedNow,
    ),
    Op("/api/providers", "get", "list_providers", "Providers you may see", query=S.PageQuery),
    Op("/api/providers", "post", "create_provider", "Create a provider", M.ProviderCreate, status=201, idempotent=True),
    Op("/api/providers/{provider_id}", "get", "get_provider", "A provider and the work it still has"),
    Op(
        "/api/providers/{provider_id}",
        "post",
        "update_provider",
        "Pause, set concurrency",
        S.ProviderUpdate,
        result=S.ProviderRow,
    ),
    Op(
        "/api/providers/{provider_id}", "patch", "change_provider", "Change a provider (new address: key again)", M.ProviderFields
    ),
    Op("/api/providers/{provider_id}", "delete", "delete_provider", "Delete a provider without work"),
    Op("/api/providers/{provider_id}/test", "post", "test_provider_key", "Test the stored key at its stored address"),
    Op("/api/album", "get", "list_album", "Album items newest first, by key", query=S.AlbumQuery, result=A.AlbumPage),
    Op("/api/album/{item_id}", "delete", "delete_album_item", "Delete an album item and free its storage"),
    Op(
        "/api/album/{item_id}/file",
        "get",
        "album_file",
        "An album item's file, streamed: with the token, or without one through a download_url (?sig=, 15 minutes)",
        media=FILE,
    ),
    Op(
        "/api/projects/{project_id}/generate",
        "post",
        "generate_drafts",
        "Count, preview and (create: true) make the drafts of a workflow's combinations",
        B.GenerateDrafts,
        result=B.DraftsGenerated,
        idempotent=True,
    ),
    Op("/api/projects/{project_id}/workflow", "get", "get_workflow", "A project's stored workflow", result=B.Workflow),
    Op("/api/wildcards", "get", "list_wildcards", "Your named wildcard lists", result=B.WildcardLists),
    Op("/api/wildcards", "post", "save_wildcards", "Save a wildcard list", B.WildcardListIn, result=B.WildcardListOut),
    Op("/api/wildcards/{name}", "delete", "delete_wildcards", "Delete a wildcard list"),
    Op(
        "/api/projects/{project_id}/reuse",
        "post",
        "reuse_jobs",
        "New drafts from jobs or album items with a change",
        B.ReuseJobs,
        status=201,
        result=B.DraftsReused,
    ),
    Op("/api/projects/{project_id}/prompts", "get", "recent_prompts", "A project's recent prompts", result=B.RecentPrompts),
    Op("/api/templates", "get", "list_templates", "Your prompt templates", result=B.PromptTemplates),
    Op("/api/templates", "post", "save_template", "Save a prompt template", B.PromptTemplateIn),
    Op("/api/templates/{name}", "delete", "delete_template", "Delete a prompt template"),
    Op("/api/openapi.json", "get", "openapi", "This document", public=True),
]


def _query_parameters(model: type[BaseModel], definitions: dict) -> list[dict]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions.update(schema.pop("$defs", {}))
    return [
        {"name": name, "in": "query", "required": False, "schema": {k: v for k, v in prop.items() if k != "title"}}
        for name, prop in schema["properties"].items()
    ]


def _parameters(op: Op, components: dict) -> list[dict]:
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": schema}
        for name, schema in PATH_IDS.items()
        if "{" + name + "}" in op.path
    ]
    if op.query is not None:
        parameters += _query_parameters(op.query, components)
    if op.idempotent:
        parameters.append(
            {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 200}}
        )
    return parameters


def _operation(op: Op, refs: dict, components: dict) -> dict:
    result = refs[(op.result, "validation")] if op.result else ANY_OBJECT
    content = op.media or {"application/json": {"schema": result}}
    responses = {str(op.status): {"description": "done", "content": content}}
    if op.status != 200:  # the same request again answers 200 (an idempotent replay, a known image)
        responses["200"] = responses[str(op.status)]
    for code, text in REFUSALS:
        responses[str(code)] = {"description": text, "content": {"application/json": {"schema": ERROR}}}
    operation = {
        "operationId": op.id,
        "summary": op.summary,
        "parameters": _parameters(op, components),
        "security": [] if op.public else [{"token": []}],
        "responses": responses,
    }
    if op.body is not None:
        schema = refs[(op.body, "validation")]
        operation["requestBody"] = {"required": False, "content": {"application/json": {"schema": schema}}}
    if op.multipart is not None:
        operation["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": op.multipart}}}
    return operation


def document() -> dict:
    models = {model for op in OPERATIONS for model in (op.body, op.result) if model is not None}
    refs, top = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    components = dict(top.get("$defs", {}))
    paths: dict = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op, refs, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Remix Studio Queue API", "version": "1.2"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer", "description": "a personal API token (rsq_…)"}},
        },
    }


@require_GET
def openapi_view(request):
    return JsonResponse(document())
