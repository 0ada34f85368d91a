"""The JSON API for managing projects and providers (the rest of the API is in api.py,
whose `endpoint` decorator authenticates, parses and maps refusals to {"error": …}).

- GET/POST /api/projects, GET/PATCH/DELETE /api/projects/<id>
- GET/POST /api/providers, GET/PATCH/DELETE /api/providers/<id> (POST there keeps its old
  meaning: set paused and/or concurrency), POST /api/providers/<id>/test

Only the owner changes a project. Staff see every provider; changing another user's (or
testing its key) needs the change permission (selectors/visibility.py)."""

import inspect

from queue_app.models import Project, Provider
from queue_app.selectors.agents import provider_json
from queue_app.selectors.estimate import start_estimate
from queue_app.selectors.projects import own_projects, project_counts, project_footprint, project_json, storage_summary
from queue_app.selectors.visibility import provider_visible, visible_to
from queue_app.services.errors import ServiceError
from queue_app.services.idempotency import idempotent
from queue_app.services.projects import project_create, project_delete, project_set_archived, project_update
from queue_app.services.providers import provider_delete, provider_save, provider_test_key, provider_work
from queue_app.web import api, cursors, schemas
from queue_app.web.api import answer, endpoint, visible_project

ARCHIVED = {"false": False, "true": True, "all": None}


@endpoint("GET", "POST")
def projects_view(request, body):
    if request.method == "GET":
        query = schemas.validate_query(schemas.ProjectsQuery, request.GET)
        projects = own_projects(request.user, archived=ARCHIVED[query.archived])
        rows = [project_json(project, counts=project.counts) for project in projects]
        return answer(paged(request, query, "projects", rows))
    payload, code = idempotent(
        user=request.user,
        key=request.headers.get("Idempotency-Key"),
        scope="projects:create",
        body=body,
        run=lambda: (project_json(project_create(user=request.user, data=body)), 201),
    )
    return answer(payload, code)


def paged(request, query, key: str, rows: list[dict]) -> dict:
    """`rows` whole, or (asked with `cursor` or `limit`) one page of them by id: a row
    created or deleted between two pages neither repeats nor hides another."""
    if "cursor" not in request.GET and query.limit is None:
        return {key: rows}
    after, limit = cursors.after_id(query.cursor), query.limit or 50
    rows = sorted((row for row in rows if row["id"] > after), key=lambda row: row["id"])
    page = rows[:limit]
    return {key: page, "next_cursor": cursors.id_cursor(page[-1]["id"]) if len(rows) > limit else None}


def project_change(user, project: Project, body: dict) -> Project:
    data = dict(body)
    archived = data.pop("archived", None)
    if archived is not None and not isinstance(archived, bool):
        raise ServiceError("archived must be true or false")
    if project.owner_id != user.id:
        raise ServiceError("only the project's owner can change it", 403)
    if data:  # checked whole before anything is written
        project_update(user=user, project=project, data=data)
    if archived is not None:
        project_set_archived(user=user, project=project, archived=archived)
    return project


@endpoint("GET", "PATCH", "DELETE")
def project_view(request, body, project_id):
    project = visible_project(request.user, project_id)
    if request.method == "GET":
        return answer(
            {
                **project_json(project, counts=project_counts(project)),
                "footprint": project_footprint(project),
                "storage": storage_summary(project.owner, project=project),
                "cost": start_estimate(project),
            }
        )
    if request.method == "PATCH":
        if not body:
            raise ServiceError("give the fields to change")
        return answer(project_json(project_change(request.user, project, body)))
    return answer(project_remove(request.user, project))


def project_remove(user, project: Project) -> dict:
    if project.owner_id != user.id:
        raise ServiceError("only the project's owner can delete it", 403)
    return {"deleted": True, **project_delete(user=user, project=project)}


@endpoint("POST")
def estimate_view(request, body, project_id):
    """What POST …/start with this body would cost; starts nothing."""
    project = visible_project(request.user, project_id)
    args = schemas.validate(schemas.StartJobs, body)
    return answer(estimate_for(project, args))


def estimate_for(project, args) -> dict:
    return start_estimate(project, job_ids=args.ids()) if args.job_ids else start_estimate(project)


def visible_provider(user, provider_id) -> Provider:
    provider = provider_visible(user, provider_id)
    if provider is None:
        raise ServiceError("provider not found", 404, field="provider_id")
    return provider


@endpoint("GET", "POST")
def providers_view(request, body):
    if request.method == "GET":
        query = schemas.validate_query(schemas.PageQuery, request.GET)
        rows = [provider_json(p) for p in visible_to(request.user, Provider).order_by("id")]
        return answer(paged(request, query, "providers", rows))
    payload, code = idempotent(
        user=request.user,
        key=request.headers.get("Idempotency-Key"),
        scope="providers:create",
        body={key: value for key, value in body.items() if key not in ("api_key", "api_secret")},
        run=lambda: (provider_json(provider_save(user=request.user, data=body)), 201),
    )
    return answer(payload, code)


@endpoint("GET", "POST", "PATCH", "DELETE")
def provider_view(request, body, provider_id):
    if request.method == "POST":
        # the original endpoint: {"paused": …} and/or {"concurrency": …}
        return inspect.unwrap(api.provider_view)(request, body, provider_id)
    provider = visible_provider(request.user, provider_id)
    if request.method == "GET":
        return answer({**provider_json(provider), "work": provider_work(provider)})
    if request.method == "PATCH":
        if not body:
            raise ServiceError("give the fields to change")
        return answer(provider_json(provider_save(user=request.user, provider=provider, data=body)))
    return answer(provider_delete(user=request.user, provider_id=provider.id))


@endpoint("POST")
def provider_test_view(request, body, provider_id):
    provider = visible_provider(request.user, provider_id)
    return answer(provider_test_key(user=request.user, provider_id=provider.id))
