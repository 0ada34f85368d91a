"""The Queue Monitor (/queue/): totals, providers, projects and the job list.

Reads go through the one selector (queue_status + jobs_page): a constant
number of queries whatever the number of jobs, and the job list is paginated. The page
refreshes its live part by polling `?fragment=1` every few seconds while the tab is
visible. Actions are POSTs with CSRF that call the same services as the API and admin
(which log them with the actor); clearing or retrying failed jobs first shows how many
jobs the scope holds and asks for confirmation.
"""

import logging
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.template.backends.utils import csrf_input
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from queue_app import limits
from queue_app.engine import heartbeats
from queue_app.models import Project, Provider
from queue_app.selectors.job_list import jobs_page
from queue_app.selectors.jobs import attention_jobs
from queue_app.selectors.projects import project_choices
from queue_app.selectors.queue import COUNT_KEYS, queue_status
from queue_app.selectors.visibility import visible_providers
from queue_app.services import priority
from queue_app.services.acting import JOBS
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import failed_jobs_clear, failed_jobs_retry, failed_scope
from queue_app.services.providers import provider_clear_cooldown, provider_set_concurrency, provider_set_paused
from queue_app.web import history

log = logging.getLogger(__name__)

REFRESH_SECONDS = 4
PER_PAGE = 50
COUNT_LIMIT = 10_000
PROJECT_ROWS = 50
STATE_CHOICES = [
    ("active", "Active + failed"),
    ("waiting", "Waiting"),
    ("queued", "Queued"),
    ("running", "Running"),
    ("detached", "Detached"),
    ("stalled", "Stalled"),
    ("failed", "Failed"),
    ("completed", "Completed"),
    ("draft", "Drafts"),
    ("all", "All"),
]


def age(seconds) -> str:
    """12s, 3m 04s, 2h 05m, 3d 04h — the queue latency as an operator reads it."""
    if seconds is None:
        return "—"
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600:02d}h"


def _int_or_none(value):
    try:
        number = int(value) if value not in (None, "") else None
    except (TypeError, ValueError, OverflowError):
        return None
    return number if number is None or abs(number) < 2**63 else None


def filters_from(query) -> dict:
    return {
        "state": query.get("state") or "active",
        "provider_id": _int_or_none(query.get("provider")),
        "project_id": _int_or_none(query.get("project")),
        "model": (query.get("model") or "").strip()[:200],
        "error": (query.get("error") or "").strip()[:200],
        "search": (query.get("q") or "").strip()[:200],  # prompt text, job id, task id (selectors/search.py)
    }


def _stamps(row: dict, fmt: str, *keys) -> dict:
    """The times a row shows, formatted once here in the current time zone (what the
    template's `date` filter did, at a tenth of its cost over a page's ~140 times):
    created_at → created, cooling_down_until → cooling_down_until_dt; '' when unset."""
    for key in keys:
        name = key[:-3] if key.endswith("_at") else key + "_dt"
        moment = parse_datetime(row[key]) if row.get(key) else None
        row[name] = timezone.localtime(moment).strftime(fmt) if moment else ""
    return row


def known_total(summary: dict, filters: dict) -> int | None:
    """The job list's total when queue_status already counted it (a state filter alone,
    or with one provider or one project), so the page runs no second count."""
    state = filters["state"]
    if filters["model"] or filters["error"] or filters.get("search") or (filters["provider_id"] and filters["project_id"]):
        return None
    keys = ("pending", "processing", "failed") if state == "active" else (state,)
    if not all(key in COUNT_KEYS for key in keys):
        return None
    if filters["provider_id"]:
        # a provider row counts processing jobs by the slot they hold and pending ones by
        # their provider: the same bucket as the job filter
        row = next((r for r in summary["providers"] if r["id"] == filters["provider_id"]), None)
        return sum(row[key] for key in keys) if row else None
    if filters["project_id"]:
        row = next((r for r in summary["projects"] if r["id"] == filters["project_id"]), None)
        return sum(row[key] for key in keys) if row else 0  # a project without work is not listed
    return sum(summary["totals"][key] for key in keys)


def monitor_context(request) -> dict:
    now = timezone.now()
    user = request.user
    providers = visible_providers(user)
    live = heartbeats.liveness(now=now)
    summary = queue_status(user=user, breakdown="all", now=now, providers=providers, live=live)
    filters = filters_from(request.GET)
    page = _int_or_none(request.GET.get("page")) or 1
    jobs = jobs_page(
        user=user,
        page=page,
        per_page=PER_PAGE,
        now=now,
        providers=providers,
        live=live,
        count_limit=COUNT_LIMIT,
        known_total=known_total(summary, filters),
        **filters,
    )
    for row in jobs["jobs"]:
        _stamps(row, "%m-%d %H:%M:%S", "created_at", "started_at")
        for attempt in row.get("attempt_log", []):
            _stamps(attempt, "%H:%M:%S", "started_at", "finished_at")
    for row in summary["providers"]:
        row["slot_percent"] = min(100, round(100 * row["active_slots"] / row["concurrency"])) if row["concurrency"] else 0
        row["latency"] = age(row["oldest_queued_age_seconds"])
        _stamps(row, "%H:%M:%S", "cooling_down_until")
    # the busiest projects; the job filter reaches the rest
    summary["projects_shown"] = summary["projects"][:PROJECT_ROWS]
    for row in summary["projects_shown"]:
        _stamps(row, "%Y-%m-%d %H:%M:%S", "latest_job_at")
    totals = summary["totals"]
    totals["latency"] = age(totals["oldest_queued_age_seconds"])
    totals["slot_percent"] = min(100, round(100 * totals["active_slots"] / totals["concurrency"])) if totals["concurrency"] else 0
    query = {k: v for k, v in request.GET.items() if k in ("state", "provider", "project", "model", "error", "q", "range") and v}
    return {
        "summary": summary,
        "totals": totals,
        "jobs": jobs,
        "filters": filters,
        "state_choices": STATE_CHOICES,
        "project_choices": project_choices(request.user, selected=filters["project_id"]),
        "query": urlencode(query),
        "here": request.get_full_path().replace("fragment=1", "").rstrip("?&") or "/queue/",
        "refresh_seconds": REFRESH_SECONDS,
        "attention": attention_jobs(user),
        "now": now,
        "concurrency_limit": limits.CONCURRENCY,
        # every form's CSRF field, built once: {% csrf_token %} formats it anew for each
        # of the page's ~150 forms
        "csrf_input": csrf_input(request),
    }


@login_required
def monitor(request):
    context = monitor_context(request)
    # history charts, percentiles and provider alerts (queue_app/web/history.py)
    range_name = request.GET.get("range") or "hour"
    context.update(
        history.history_context(user=request.user, summary=context["summary"], range_name=range_name, now=context["now"])
    )
    if request.GET.get("fragment"):
        return render(request, "queue_app/monitor_live.html", context)
    return render(request, "queue_app/monitor.html", context)


def safe_next(request, default="/queue/") -> str:
    target = request.POST.get("next") or default
    if not target.startswith("/") or not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return default
    return target


def back(request, default="/queue/"):
    return redirect(safe_next(request, default))


@login_required
@require_POST
def provider_action(request, provider_id, action):
    if not 0 < provider_id < 2**63:
        raise Http404("provider not found")
    try:
        if action == "pause":
            provider = provider_set_paused(user=request.user, provider_id=provider_id, paused=True)
            messages.success(request, f"{provider.name} paused: no new jobs are dispatched to it")
        elif action == "resume":
            provider = provider_set_paused(user=request.user, provider_id=provider_id, paused=False)
            messages.success(request, f"{provider.name} resumed")
        elif action == "concurrency":
            value = _int_or_none(request.POST.get("concurrency"))
            provider = provider_set_concurrency(
                user=request.user, provider_id=provider_id, concurrency=value if value is not None else -1
            )
            messages.success(request, f"{provider.name}: concurrency {provider.concurrency}")
        elif action == "retry-now":
            done = priority.provider_retry_now(user=request.user, provider_id=provider_id)["retried_now"]
            messages.success(request, f"{done} job(s) out of retry backoff")
        elif action == "clear-cooldown":
            provider = provider_clear_cooldown(user=request.user, provider_id=provider_id)
            messages.success(request, f"{provider.name}: cool-down cleared")
        else:
            messages.error(request, "unknown action")
    except ServiceError as refusal:
        if refusal.code == 404:
            raise Http404(refusal.message) from None
        messages.error(request, refusal.message)
    return back(request)


def scope_of(request) -> dict:
    """The scope of a failed-jobs action from the form."""
    scope = request.POST.get("scope", "all")
    if scope == "project":
        project_id = _int_or_none(request.POST.get("project"))
        if project_id is None:
            raise ServiceError("choose a project")
        return {"project_id": project_id, "provider_id": None}
    if scope == "provider":
        provider_id = _int_or_none(request.POST.get("provider"))
        if provider_id is None:
            raise ServiceError("choose a provider")
        return {"project_id": None, "provider_id": provider_id}
    return {"project_id": None, "provider_id": None}


def scope_label(user, scope: dict) -> str:
    """How to name a scope; call only after failed_scope accepted it (no name leaks)."""
    if scope["project_id"]:
        name = Project.objects.filter(id=scope["project_id"]).values_list("name", flat=True).first() or ""
        return f"project “{name}”"
    if scope["provider_id"]:
        name = Provider.objects.filter(id=scope["provider_id"]).values_list("name", flat=True).first() or ""
        return f"provider queue “{name}”"
    return "all users' queues" if user.has_perm(JOBS) else "all your projects"


@login_required
@require_POST
def failed_action(request, action):
    """Retry or clear failed jobs in one scope: first a confirmation naming how many jobs
    it affects, then (confirm=1) the service call."""
    if action not in ("retry", "clear"):
        messages.error(request, "unknown action")
        return back(request)
    try:
        scope = scope_of(request)
        count = failed_scope(user=request.user, **scope).count()
        label = scope_label(request.user, scope)
        if request.POST.get("confirm") != "1":
            return render(
                request,
                "queue_app/confirm_failed.html",
                {
                    "action": action,
                    "count": count,
                    "label": label,
                    "scope": request.POST.get("scope", "all"),
                    "project": scope["project_id"] or "",
                    "provider": scope["provider_id"] or "",
                    "next": safe_next(request),
                },
            )
        if action == "clear":
            done = failed_jobs_clear(user=request.user, **scope)["cleared"]
            messages.success(request, f"{done} failed job(s) cleared in {label}")
        else:
            done = failed_jobs_retry(user=request.user, **scope)["retried"]
            messages.success(request, f"{done} failed job(s) retried in {label}")
        log.info("monitor: %s failed by %s (user %s): %d job(s), %s", action, request.user.username, request.user.pk, done, label)
    except ServiceError as refusal:
        if refusal.code == 404:
            raise Http404(refusal.message) from None
        messages.error(request, refusal.message)
    return back(request)
