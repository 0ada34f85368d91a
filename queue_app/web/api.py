"""The JSON API. Thin: authenticate, parse, call one service or selector, answer JSON.

Authentication is the session (browser; CSRF checked on writes) or a personal API token
(`Authorization: Bearer rsq_…`; no CSRF, nothing ambient to forge). Another user's
project, provider or job answers 404 — never 403 — so ids cannot be probed.
Errors are {"error": "<readable message>"} with the status code of the refusal.

`Idempotency-Key` on the creating, starting and cancelling endpoints (services.idempotent):
the same key and body replays the first response, a different body answers 422, a request
still running under that key answers 409. Keys are per user and kept at least 24 hours.
"""

import json
import logging
import uuid
from functools import wraps

from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from queue_app import selectors, services
from queue_app.models import Project
from queue_app.web import tokens

log = logging.getLogger(__name__)

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
BREAKDOWNS = ("none", "projects", "providers", "all")
SETTING_KEYS = (*services.DRAFT_FIELDS, "duration", "params", "references")


def answer(payload, status_code: int = 200) -> JsonResponse:
    return JsonResponse(payload, status=status_code, encoder=DjangoJSONEncoder, safe=False)


def error(message: str, status_code: int) -> JsonResponse:
    return answer({"error": message}, status_code)


def authenticate(request):
    """The user of a request (token first, then session), or an error response."""
    raw = tokens.bearer(request)
    if raw is not None:
        user = tokens.user_for_token(raw)
        if user is None:
            return None, error("invalid API token", 401)
        return user, None
    if request.user.is_authenticated:
        if request.method not in SAFE_METHODS:
            # A session is ambient authority: writes need the CSRF token like a form does.
            rejected = CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})
            if rejected is not None:
                return None, error("CSRF check failed", 403)
        return request.user, None
    return None, error("authentication required: sign in or send Authorization: Bearer <token>", 401)


def endpoint(*methods):
    def decorate(view):
        @csrf_exempt
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if request.method not in methods:
                response = error(f"method {request.method} not allowed", 405)
                response["Allow"] = ", ".join(methods)
                return response
            user, refused = authenticate(request)
            if refused is not None:
                return refused
            request.user = user
            body = {}
            if request.method in ("POST", "PATCH") and request.body:
                try:
                    body = json.loads(request.body)
                except (ValueError, UnicodeDecodeError):
                    return error("the body is not valid JSON", 400)
                if not isinstance(body, dict):
                    return error("the body must be a JSON object", 400)
            try:
                return view(request, body, *args, **kwargs)
            except services.ServiceError as refusal:
                return error(refusal.message, refusal.code)
            except Http404:
                return error("not found", 404)

        return wrapper

    return decorate


MAX_ID = 2**63 - 1


def visible_project(user, project_id) -> Project:
    if isinstance(project_id, bool) or not isinstance(project_id, int) or not 1 <= project_id <= MAX_ID:
        raise services.ServiceError("project not found", 404)
    projects = Project.objects.all() if user.is_staff else Project.objects.filter(owner=user)
    project = projects.filter(id=project_id).first()
    if project is None:
        raise services.ServiceError("project not found", 404)
    return project


def whole_number(value, name: str, *, low: int, high: int, default=None) -> int:
    if value in (None, ""):
        if default is None:
            raise services.ServiceError(f"{name} is required")
        return default
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise services.ServiceError(f"{name} must be a whole number") from None
    if isinstance(value, bool) or isinstance(value, float) or not low <= number <= high:
        raise services.ServiceError(f"{name} must be a whole number from {low} to {high}")
    return number


def uuid_list(values, name: str = "job_ids") -> list[str]:
    if not isinstance(values, list) or not values or len(values) > services.MAX_DRAFTS_PER_REQUEST:
        raise services.ServiceError(f"{name} must be a list of 1 to {services.MAX_DRAFTS_PER_REQUEST} job ids")
    try:
        return [str(uuid.UUID(str(value))) for value in values]
    except ValueError:
        raise services.ServiceError(f"{name} must hold job ids (UUIDs)") from None


def failed_scope_args(user, body) -> dict:
    """{project_id, provider_id} of a clear/retry request: scope all, project or provider."""
    project_id, provider_id = body.get("project_id"), body.get("provider_id")
    if project_id is not None and provider_id is not None:
        raise services.ServiceError("project_id and provider_id are mutually exclusive: choose one scope")
    scope = body.get("scope") or ("project" if project_id is not None else "provider" if provider_id is not None else "all")
    if scope not in ("all", "project", "provider"):
        raise services.ServiceError("scope must be all, project or provider")
    if scope == "all" and (project_id is not None or provider_id is not None):
        raise services.ServiceError("scope all takes no project_id or provider_id")
    if scope == "project":
        return {"project_id": whole_number(project_id, "project_id", low=1, high=2**62), "provider_id": None}
    if scope == "provider":
        return {"project_id": None, "provider_id": whole_number(provider_id, "provider_id", low=1, high=2**62)}
    return {"project_id": None, "provider_id": None}


# --- Queue ------------------------------------------------------------------------------


@endpoint("GET")
def queue_status_view(request, body):
    breakdown = request.GET.get("breakdown", "none")
    if breakdown not in BREAKDOWNS:
        return error("breakdown must be none, projects, providers or all", 400)
    limit = request.GET.get("limit")
    limit = whole_number(limit, "limit", low=1, high=1000) if limit not in (None, "") else None
    return answer(selectors.queue_status(user=request.user, breakdown=breakdown, limit=limit))


def failed_action(user, body, *, action: str) -> dict:
    scope = failed_scope_args(user, body)
    if body.get("dry_run"):
        count = services.failed_scope(user=user, **scope).count()
        return {"dry_run": True, "affected": count, **scope}
    if action == "clear":
        result = services.failed_jobs_clear(user=user, **scope)
        return {"cleared": result["cleared"], **scope}
    result = services.failed_jobs_retry(user=user, **scope)
    return {"retried": result["retried"], **scope}


@endpoint("POST")
def clear_failed_view(request, body):
    return answer(failed_action(request.user, body, action="clear"))


@endpoint("POST")
def retry_failed_view(request, body):
    return answer(failed_action(request.user, body, action="retry"))


# --- Projects and jobs ------------------------------------------------------------------


def draft_settings(body) -> dict:
    values = dict(body.get("settings") or {}) if isinstance(body.get("settings"), dict) else {}
    if body.get("settings") is not None and not isinstance(body.get("settings"), dict):
        raise services.ServiceError("settings must be an object")
    for key in SETTING_KEYS:
        if key in body:
            values[key] = body[key]
    return values


def drafts_create(user, project: Project, body) -> tuple[dict, int]:
    from queue_app.models import Provider

    unknown = set(body) - {"prompt", "quantity", "provider_id", "settings", "project_id", "per_line", *SETTING_KEYS}
    if unknown:
        raise services.ServiceError(f"unknown field(s): {', '.join(sorted(unknown))}")
    provider = None
    if body.get("provider_id") is not None:
        provider_id = whole_number(body["provider_id"], "provider_id", low=1, high=2**62)
        provider = Provider.objects.filter(id=provider_id, owner=project.owner).first()
        if provider is None:
            raise services.ServiceError("provider not found", 404)
    quantity = body.get("quantity", 1)
    per_line = body.get("per_line", False)
    if not isinstance(per_line, bool):
        raise services.ServiceError("per_line must be true or false")
    jobs = services.jobs_create_drafts(
        user=project.owner,
        project=project,
        prompt=body.get("prompt") if isinstance(body.get("prompt"), str) else "",
        quantity=quantity,
        provider=provider,
        settings_=draft_settings(body),
        per_line=per_line,
    )
    return {"project_id": project.id, "count": len(jobs), "jobs": [{"id": str(j.id), "status": j.status} for j in jobs]}, 201


@endpoint("POST")
def drafts_view(request, body, project_id):
    project = visible_project(request.user, project_id)
    payload, code = services.idempotent(
        user=request.user,
        key=request.headers.get("Idempotency-Key"),
        scope=f"drafts:{project.id}",
        body=body,
        run=lambda: drafts_create(request.user, project, body),
    )
    return answer(payload, code)


@endpoint("POST")
def start_view(request, body, project_id):
    project = visible_project(request.user, project_id)
    all_drafts = body.get("all_drafts", False)
    if not isinstance(all_drafts, bool):
        raise services.ServiceError("all_drafts must be true or false")
    job_ids = uuid_list(body["job_ids"]) if body.get("job_ids") is not None else None
    if not all_drafts and not job_ids:
        raise services.ServiceError("give job_ids or all_drafts: true")
    payload, code = services.idempotent(
        user=request.user,
        key=request.headers.get("Idempotency-Key"),
        scope=f"start:{project.id}",
        body=body,
        run=lambda: (services.jobs_start(user=project.owner, project=project, job_ids=job_ids, all_drafts=all_drafts), 200),
    )
    return answer(payload, code)


@endpoint("POST")
def jobs_retry_view(request, body):
    job_ids = uuid_list(body.get("job_ids"))
    visible = selectors.visible_jobs(request.user).filter(id__in=job_ids)
    if visible.count() != len(set(job_ids)):
        raise services.ServiceError("job not found", 404)
    owners = set(visible.values_list("owner_id", flat=True))
    retried = []
    from django.contrib.auth import get_user_model

    for owner in get_user_model().objects.filter(id__in=owners):
        retried += services.jobs_retry(user=owner, job_ids=job_ids)["retried"]
    return answer({"retried": retried, "skipped": len(set(job_ids)) - len(retried)})


def jobs_cancel(user, job_ids: list[str]) -> dict:
    """Cancel pending/processing jobs the user may see (staff: anyone's); one that is not
    visible makes the whole request 404, like a retry. The API and MCP share this."""
    visible = selectors.visible_jobs(user).filter(id__in=job_ids)
    if visible.count() != len(set(job_ids)):
        raise services.ServiceError("job not found", 404)
    from django.contrib.auth import get_user_model

    cancelled = 0
    for owner in get_user_model().objects.filter(id__in=set(visible.values_list("owner_id", flat=True))):
        cancelled += services.jobs_cancel(user=owner, job_ids=job_ids)["cancelled"]
    return {"cancelled": cancelled, "skipped": len(set(job_ids)) - cancelled}


@endpoint("POST")
def jobs_cancel_view(request, body):
    job_ids = uuid_list(body.get("job_ids"))
    payload, code = services.idempotent(
        user=request.user,
        key=request.headers.get("Idempotency-Key"),
        scope="cancel",
        body=body,
        run=lambda: (jobs_cancel(request.user, job_ids), 200),
    )
    return answer(payload, code)


@endpoint("GET")
def project_jobs_view(request, body, project_id):
    project = visible_project(request.user, project_id)
    state = request.GET.get("status") or "all"
    if state not in selectors.JOB_FILTER_STATES:
        return error("status must be one of " + ", ".join(selectors.JOB_FILTER_STATES), 400)
    page = whole_number(request.GET.get("page"), "page", low=1, high=10**9, default=1)
    per_page = whole_number(request.GET.get("per_page"), "per_page", low=1, high=selectors.MAX_PER_PAGE, default=50)
    result = selectors.jobs_page(
        user=request.user,
        project_id=project.id,
        state=state,
        page=page,
        per_page=per_page,
        with_attempts=request.GET.get("attempts") in ("1", "true"),
    )
    return answer({"project_id": project.id, **result})


@endpoint("POST")
def provider_view(request, body, provider_id):
    if not 1 <= provider_id <= MAX_ID:
        raise services.ServiceError("provider not found", 404)
    if not any(key in body for key in ("paused", "concurrency")):
        raise services.ServiceError("give paused (true/false) and/or concurrency")
    provider = None
    if "paused" in body:
        if not isinstance(body["paused"], bool):
            raise services.ServiceError("paused must be true or false")
        provider = services.provider_set_paused(user=request.user, provider_id=provider_id, paused=body["paused"])
    if "concurrency" in body:
        provider = services.provider_set_concurrency(user=request.user, provider_id=provider_id, concurrency=body["concurrency"])
    return answer(
        {
            "id": provider.id,
            "name": provider.name,
            "family": provider.family,
            "paused": provider.paused,
            "concurrency": provider.concurrency,
        }
    )
