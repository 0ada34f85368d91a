"""The OpenAPI 3.1 document of the JSON API, at /api/openapi.json, generated from the
operation schemas in `queue_app.web.schemas` (the same models the views validate with), so
the document cannot drift from the handlers. Routes other modules add are listed where
they declare themselves; this lists the queue, draft, start, retry and provider routes."""

from django.http import JsonResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from queue_app.web import agent_schemas as A
from queue_app.web import schemas as S

ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
ANY_OBJECT = {"type": "object"}

# (path, method, operation id, summary, body model, query model, success status, result model)
OPERATIONS = [
    ("/api/queue/status", "get", "queue_status", "Queue totals", None, S.QueueStatusQuery, 200, A.QueueStatusOut),
    ("/api/queue/clear-failed", "post", "clear_failed", "Clear failed jobs", S.FailedScope, None, 200, S.FailedResult),
    ("/api/queue/retry-failed", "post", "retry_failed", "Retry failed jobs", S.FailedScope, None, 200, S.FailedResult),
    ("/api/projects", "get", "list_projects", "The projects", None, S.ProjectsQuery, 200, A.ProjectList),
    ("/api/projects/{project_id}", "get", "get_project", "A project", None, None, 200, A.ProjectView),
    ("/api/projects/{project_id}/drafts", "post", "create_drafts", "Create drafts", S.CreateDrafts, None, 201, S.DraftsCreated),
    ("/api/projects/{project_id}/start", "post", "start_jobs", "Start jobs", S.StartJobs, None, 200, S.JobsStarted),
    ("/api/projects/{project_id}/jobs", "get", "project_jobs", "A page of a project's jobs", None, S.ProjectJobsQuery, 200, None),
    ("/api/jobs/retry", "post", "retry_jobs", "Retry chosen failed jobs", S.RetryJobs, None, 200, S.JobsRetried),
    ("/api/providers/{provider_id}", "post", "update_provider", "Update a provider", S.ProviderUpdate, None, 200, S.ProviderRow),
]
IDEMPOTENT = {"create_drafts", "start_jobs"}


def _query_parameters(model: type[BaseModel], definitions: dict) -> list[dict]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions.update(schema.pop("$defs", {}))
    return [
        {"name": name, "in": "query", "required": False, "schema": {k: v for k, v in prop.items() if k != "title"}}
        for name, prop in schema["properties"].items()
    ]


def document() -> dict:
    models = {model for op in OPERATIONS for model in (op[4], op[7]) if model is not None}
    refs, top = models_json_schema(
        [(model, "validation") for model in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    components = dict(top.get("$defs", {}))
    paths: dict = {}
    for path, method, op_id, summary, body, query, status, result in OPERATIONS:
        parameters = []
        for name in ("project_id", "provider_id"):
            if "{" + name + "}" in path:
                id_schema = {"type": "integer", "minimum": 1, "maximum": S.MAX_ID}
                parameters.append({"name": name, "in": "path", "required": True, "schema": id_schema})
        if query is not None:
            parameters += _query_parameters(query, components)
        if op_id in IDEMPOTENT:
            parameters.append(
                {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 200}}
            )
        operation = {
            "operationId": op_id,
            "summary": summary,
            "parameters": parameters,
            "security": [{"token": []}],
            "responses": {
                str(status): {
                    "description": "done",
                    "content": {"application/json": {"schema": refs[(result, "validation")] if result else ANY_OBJECT}},
                },
                **{
                    str(code): {"description": text, "content": {"application/json": {"schema": ERROR}}}
                    for code, text in (
                        (400, "the request does not fit the schema"),
                        (401, "no or an invalid token"),
                        (403, "refused (CSRF, storage limit)"),
                        (404, "not found, or not yours"),
                        (405, "method not allowed"),
                        (409, "the same Idempotency-Key is still running"),
                        (413, "the body is too large"),
                        (422, "the Idempotency-Key was used with another request"),
                    )
                },
            },
        }
        if body is not None:
            body_schema = refs[(body, "validation")]
            operation["requestBody"] = {"required": False, "content": {"application/json": {"schema": body_schema}}}
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Remix Studio Queue API", "version": "1.1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer", "description": "a personal API token (rsq_…)"}},
        },
    }


def openapi_view(request):
    return JsonResponse(document())
