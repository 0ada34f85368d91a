"""The JSON API. Thin: authenticate, parse, call one service or selector, answer JSON.

Authentication is the session (browser; CSRF checked on writes) or a personal API token
(`Authorization: Bearer rsq_…`; no CSRF, nothing ambient to forge). Another user's
project, provider or job answers 404 — never 403 — so ids cannot be probed.
Errors are {"error": "<readable message>"} with the status code of the refusal.

`Idempotency-Key` on the creating, starting and cancelling endpoints (idempotent):
the same key and body replays the first response, a different body answers 422, a request
still running under that key answers 409. Keys are per user and kept at least 24 hours.
"""

import logging
from functools import wraps

from django.core.exceptions import RequestDataTooBig
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.http import Http404, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from queue_app import limits
from queue_app.models import Job, Project
from queue_app.selectors.job_list import jobs_page
from queue_app.selectors.queue import queue_status
from queue_app.selectors.visibility import visible_to
from queue_app.services import jobs as job_writes
from queue_app.services import priority
from queue_app.services.acting import JOBS, acting_on, acting_on_jobs
from queue_app.services.drafts import jobs_create_drafts
from queue_app.services.errors import ServiceError
from queue_app.services.idempotency import idempotent
from queue_app.services.jobs import failed_jobs_clear, failed_jobs_retry, failed_scope, jobs_start
from queue_app.services.providers import _own_provider, provider_set_concurrency, provider_set_paused
from queue_app.web import refusals, schemas, tokens

log = logging.getLogger(__name__)

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
BREAKDOWNS = ("none", "projects", "providers", "all")


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


def bounded_body(request, *, noun: str = "body") -> bytes:
    """The raw body of a request, refused (413) before it is read when over the limit. The
    API and MCP share it."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limits.REQUEST_BYTES:
        raise schemas.SchemaError(f"the {noun} is {declared} bytes; the limit is {limits.REQUEST_BYTES}", 413)
    try:
        return request.body
    except RequestDataTooBig:
        raise schemas.SchemaError(f"the {noun} is larger than {limits.REQUEST_BYTES} bytes", 413) from None


def read_body(request) -> dict:
    """The JSON object of a POST or PATCH (empty: {})."""
    raw = bounded_body(request)
    if not raw:
        return {}
    body = schemas.parse_json(raw)
    if not isinstance(body, dict):
        raise schemas.SchemaError("the body must be a JSON object")
    return body


def endpoint(*methods, json_body: bool = True):
    """An API view: method check, authentication, the JSON body parsed (`json_body`; an
    upload reads its own multipart body), refusals as {"error": …}."""

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
            try:
                if json_body and request.method in ("POST", "PATCH"):
                    body = read_body(request)
                return view(request, body, *args, **kwargs)
            except ServiceError as refusal:
                described = refusals.describe(refusal)
                return answer({"error": refusal.message, **{k: v for k, v in described.items() if k != "message"}}, refusal.code)
            except Http404:
                return error("not found", 404)

        return wrapper

    return decorate


MAX_ID = 2**63 - 1


def visible_project(user, project_id) -> Project:
    if isinstance(project_id, bool) or not isinstance(project_id, int) or not 1 <= project_id <= MAX_ID:
        raise ServiceError("project not found", 404, field="project_id")
    project = visible_to(user, Project).filter(id=project_id).first()
    if project is None:
        raise ServiceError("project not found", 404, field="project_id")
    return project


def actable_project(user, project_id) -> Project:
    """A project whose jobs the user may draft, start and cancel: their own, or with the
    jobs permission; one they may only see is a 403 (selectors/visibility.py)."""
    return acting_on(user, visible_project(user, project_id), noun="project", permission=JOBS)


# --- Queue ------------------------------------------------------------------------------


@endpoint("GET")
def queue_status_view(request, body):
    query = schemas.validate_query(schemas.QueueStatusQuery, request.GET)
    return answer(queue_status(user=request.user, breakdown=query.breakdown, limit=query.limit))


def act_on_failed(user, body, *, action: str) -> dict:
    """A clear or retry request of the API or MCP (a dry run only counts)."""
    args = body if isinstance(body, schemas.FailedScope) else schemas.validate(schemas.FailedScope, body)
    scope = {"project_id": args.project_id, "provider_id": args.provider_id}
    if args.dry_run:
        count = failed_scope(user=user, **scope).count()
        return {"dry_run": True, "affected": count, **scope}
    if action == "clear":
        result = failed_jobs_clear(user=user, **scope)
        return {"cleared": result["cleared"], **scope}
    result = failed_jobs_retry(user=user, **scope)
    return {"retried": result["retried"], **scope}


@endpoint("POST")
def clear_failed_view(request, body):
    return answer(act_on_failed(request.user, body, action="clear"))


@endpoint("POST")
def retry_failed_view(request, body):
    return answer(act_on_failed(request.user, body, action="retry"))


# --- Projects and jobs ------------------------------------------------------------------


def drafts_create(user, project: Project, body) -> tuple[dict, int]:
    """Validate against schemas.CreateDrafts, create the drafts, and say what they will
    run with (the resolved settings, and each requested value the model changed)."""
    from queue_app.engine import snapshot
    from queue_app.models import Provider

    args = body if isinstance(body, schemas.CreateDrafts) else schemas.validate(schemas.CreateDrafts, body)
    provider = None
    if args.provider_id is not None:
        provider = Provider.objects.filter(id=args.provider_id, owner=project.owner).first()
        if provider is None:
            raise ServiceError("provider not found", 404, field="provider_id")
    jobs = jobs_create_drafts(
        user=project.owner,
        project=project,
        prompt=args.prompt,
        quantity=args.quantity,
        provider=provider,
        settings_=args.options(),
        per_line=args.per_line,
    )
    resolved = snapshot.build(jobs[0], project, provider or project.provider)
    for private in ("system_prompt", "temperature", "max_tokens", "params"):
        resolved.pop(private, None)
    requested = args.options()
    adjusted = {
        name: {"requested": requested[name], "used": resolved.get(name)}
        for name in ("aspect_ratio", "quality", "resolution", "format", "background", "duration")
        if name in requested and requested[name] != resolved.get(name)
    }
    payload = {
        "project_id": project.id,
        "count": len(jobs),
        "jobs": [{"id": str(j.id), "status": j.status} for j in jobs],
        "resolved": resolved,
        "adjusted": adjusted,
    }
    return payload, 201


@endpoint("POST")
def drafts_view(request, body, project_id):
    project = actable_project(request.user, project_id)
    if body.get("project_id") == project.id:
        body = {key: value for key, value in body.items() if key != "project_id"}  # the path already says it
    args = schemas.validate(schemas.CreateDrafts, body)
    payload, code = idempotent(
        user=request.user,
        key=request.headers.get("Idempotency-Key"),
        scope=f"drafts:{project.id}",
        body=body,
        run=lambda: drafts_create(request.user, project, args),
    )
    return answer(payload, code)


@endpoint("POST")
def start_view(request, body, project_id):
    project = actable_project(request.user, project_id)
    args = schemas.validate(schemas.StartJobs, body)
    job_ids, all_drafts = args.ids(), args.all_drafts
    payload, code = idempotent(
        user=request.user,
        key=request.headers.get("Idempotency-Key"),
        scope=f"start:{project.id}",
        body=body,
        run=lambda: (jobs_start(user=project.owner, project=project, job_ids=job_ids, all_drafts=all_drafts), 200),
    )
    return answer(payload, code)


@endpoint("POST")
def jobs_retry_view(request, body):
    return answer(jobs_retry(request.user, schemas.validate(schemas.RetryJobs, body)))


def jobs_retry(user, args) -> dict:
    job_ids = acting_on_jobs(user, args.job_ids)
    owners = set(Job.objects.filter(id__in=job_ids).values_list("owner_id", flat=True))
    retried = []
    from django.contrib.auth import get_user_model

    for owner in get_user_model().objects.filter(id__in=owners):
        retried += job_writes.jobs_retry(user=owner, job_ids=job_ids)["retried"]
    return {"retried": retried, "skipped": len(set(job_ids)) - len(retried)}


@endpoint("POST")
def jobs_run_next_view(request, body):
    return answer(jobs_run_next(request.user, [str(job_id) for job_id in schemas.validate(schemas.RunNextJobs, body).job_ids]))


@endpoint("POST")
def jobs_retry_now_view(request, body):
    job_ids = acting_on_jobs(request.user, [str(i) for i in schemas.validate(schemas.RetryNow, body).job_ids])
    owners = set(Job.objects.filter(id__in=job_ids).values_list("owner_id", flat=True))
    from django.contrib.auth import get_user_model

    done = []
    for owner in get_user_model().objects.filter(id__in=owners):
        done += priority.jobs_retry_now(user=owner, job_ids=job_ids)["retried_now"]
    return answer({"retried_now": done, "skipped": len(job_ids) - len(done)})


@endpoint("POST")
def provider_retry_now_view(request, body, provider_id):
    return answer(priority.provider_retry_now(user=request.user, provider_id=provider_id))


def jobs_run_next(user, job_ids: list[str]) -> dict:
    """Move pending jobs the user may act on to the front of their providers' queues (the
    pages, the monitor, the API and MCP share this); others are skipped."""
    acting_on_jobs(user, job_ids)
    job_ids = list(dict.fromkeys(map(str, job_ids)))  # the order given is the order run
    from django.contrib.auth import get_user_model

    moved = []
    owners = set(Job.objects.filter(id__in=job_ids).values_list("owner_id", flat=True))
    for owner in get_user_model().objects.filter(id__in=owners):
        moved += priority.jobs_run_next(user=owner, job_ids=job_ids)["moved"]
    order = {job_id: n for n, job_id in enumerate(job_ids)}
    return {"moved": sorted(moved, key=order.get), "skipped": len(job_ids) - len(moved)}


def jobs_cancel(user, job_ids: list[str]) -> dict:
    """Cancel pending/processing jobs the user may act on (their own; anyone's with the jobs
    permission); one that is not visible makes the whole request 404, one only visible 403,
    like a retry. The API, MCP, the monitor and its bulk actions share this."""
    job_ids = acting_on_jobs(user, job_ids)
    from django.contrib.auth import get_user_model

    cancelled = 0
    owners = set(Job.objects.filter(id__in=job_ids).values_list("owner_id", flat=True))
    for owner in get_user_model().objects.filter(id__in=owners):
        cancelled += job_writes.jobs_cancel(user=owner, job_ids=job_ids)["cancelled"]
    return {"cancelled": cancelled, "skipped": len(set(job_ids)) - cancelled}


@endpoint("POST")
def jobs_cancel_view(request, body):
    job_ids = [str(job_id) for job_id in schemas.validate(schemas.CancelJobs, body).job_ids]
    payload, code = idempotent(
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
    query = schemas.validate_query(schemas.ProjectJobsQuery, request.GET)
    if "cursor" in request.GET:  # by key (`cursor=` for the first page): no repeats, no skips
        from queue_app.selectors.job_list import jobs_after
        from queue_app.web import cursors

        after = cursors.after_time(query.cursor)
        result = jobs_after(user=request.user, project_id=project.id, state=query.status, after=after, limit=query.per_page)
        last = result.pop("next_after")
        return answer({"project_id": project.id, **result, "next_cursor": cursors.time_cursor(*last) if last else None})
    result = jobs_page(
        user=request.user,
        project_id=project.id,
        state=query.status,
        page=query.page,
        per_page=query.per_page,
        with_attempts=query.attempts,
    )
    return answer({"project_id": project.id, **result})


@endpoint("POST")
def provider_view(request, body, provider_id):
    if not 1 <= provider_id <= MAX_ID:
        raise ServiceError("provider not found", 404, field="provider_id")
    _own_provider(request.user, provider_id)  # another user's provider is 404 whatever the body says
    return answer(provider_update(request.user, provider_id, schemas.validate(schemas.ProviderUpdate, body)))


def provider_update(user, provider_id: int, args) -> dict:
    """Both changes or neither: validated in full first, then written in one transaction."""
    with transaction.atomic():
        if args.paused is not None:
            provider = provider_set_paused(user=user, provider_id=provider_id, paused=args.paused)
        if args.concurrency is not None:
            provider = provider_set_concurrency(user=user, provider_id=provider_id, concurrency=args.concurrency)
    return {
        "id": provider.id,
        "name": provider.name,
        "family": provider.family,
        "paused": provider.paused,
        "concurrency": provider.concurrency,
    }
