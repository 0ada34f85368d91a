"""The queue's numbers and the monitor's job list: queue_status, job rows, jobs_page."""

from collections import defaultdict

from django.db.models import BooleanField, Case, Count, Max, Min, Q, Value, When
from django.utils import timezone

from queue_app.engine import heartbeats, runner_registry
from queue_app.models import Job, JobAttempt, Project, Status
from queue_app.selectors import states
from queue_app.selectors.polling import poll_lag
from queue_app.selectors.visibility import visible_jobs, visible_providers

COUNT_KEYS = ("pending", "processing", "failed", "queued", "waiting", "running", "stalled", "detached")


def _flag(condition: Q):
    return Case(When(condition, then=Value(True)), default=Value(False), output_field=BooleanField())


waiting_reason = states.waiting_reason  # the public name callers know


def _empty_counts() -> dict:
    return {key: 0 for key in COUNT_KEYS}


def queue_status(
    *, user, breakdown: str = "none", limit: int | None = None, now=None, providers: dict | None = None, live: dict | None = None
) -> dict:
    """Totals, and per provider / per project rows when `breakdown` asks for them
    ("none", "projects", "providers" or "all"). Staff see everyone's queue. A caller that
    also lists jobs passes the `providers` and `live` it already read."""
    now = now or timezone.now()
    jobs = visible_jobs(user).filter(status__in=(Status.PENDING, Status.PROCESSING, Status.FAILED))
    live = heartbeats.liveness(now=now) if live is None else live
    providers = visible_providers(user) if providers is None else providers
    # Grouped by the bare columns, without joining the projects: the partial covering
    # index job_open_counts answers it from the index alone. COUNT(*), not COUNT(id): the
    # id is not in that index. The project's kind and provider come from one small query.
    groups = list(
        jobs.annotate(processing_state=states.processing_state_sql(now), backoff=_flag(states.in_backoff_sql(now)))
        .values("project_id", "provider_id", "active_provider_id", "status", "processing_state", "backoff")
        .annotate(n=Count("*"), oldest=Min("queued_at"), latest=Max("updated_at"))
        .order_by()
    )
    info = {
        row["id"]: row
        for row in Project.objects.filter(id__in={row["project_id"] for row in groups}).values(
            "id", "name", "kind", "provider_id", "provider__name"
        )
    }

    totals = _empty_counts()
    per_provider = defaultdict(_empty_counts)
    per_project = defaultdict(_empty_counts)
    provider_oldest: dict = {}
    project_latest: dict = {}
    waiting_reasons: dict = defaultdict(lambda: defaultdict(int))
    oldest_queued = None
    for row in groups:
        n, status = row["n"], row["status"]
        project = info.get(row["project_id"]) or {}
        provider_id = states.effective_provider_of(
            status=status,
            active_provider_id=row["active_provider_id"],
            provider_id=row["provider_id"],
            project_provider_id=project.get("provider_id"),
        )
        provider = providers.get(provider_id)
        keys = [status]
        if status == Status.PENDING:
            reason = waiting_reason(provider=provider, kind=project.get("kind", ""), backoff=row["backoff"], live=live, now=now)
            if reason:
                keys.append("waiting")
                waiting_reasons[provider_id][reason] += n
            else:
                keys.append("queued")
                if row["oldest"] and (oldest_queued is None or row["oldest"] < oldest_queued):
                    oldest_queued = row["oldest"]
                if provider_id and row["oldest"]:
                    current = provider_oldest.get(provider_id)
                    provider_oldest[provider_id] = min(current, row["oldest"]) if current else row["oldest"]
        elif status == Status.PROCESSING:
            keys.append(row["processing_state"])
        for key in keys:
            totals[key] += n
            per_project[row["project_id"]][key] += n
            if provider_id in providers:
                per_provider[provider_id][key] += n
        latest = project_latest.get(row["project_id"])
        if row["latest"] and (latest is None or row["latest"] > latest):
            project_latest[row["project_id"]] = row["latest"]

    active_slots = {pid: per_provider[pid]["processing"] for pid in providers}
    lag = poll_lag([pid for pid in providers if per_provider[pid]["detached"]], now=now)
    totals.update(
        projects=len(per_project),
        providers=len(providers),
        active_slots=sum(active_slots.values()),
        concurrency=sum(p["concurrency"] for p in providers.values()),
        oldest_queued_age_seconds=(now - oldest_queued).total_seconds() if oldest_queued else None,
        polling_behind=sum(row["behind"] for row in lag.values()),
    )
    totals["available_slots"] = max(0, totals["concurrency"] - totals["active_slots"])
    result = {
        "updated_at": now.isoformat(),
        "breakdown": breakdown,
        "totals": totals,
        "liveness": live,
        "warnings": _warnings(live, totals)
        + [f"{providers[pid]['name']}: {row['message']}." for pid, row in lag.items() if row["message"]],
    }

    if breakdown in ("providers", "all"):
        rows = []
        for pid, provider in providers.items():
            counts = per_provider[pid]
            cooling = provider["cooldown_until"] if provider["cooldown_until"] and provider["cooldown_until"] > now else None
            rows.append(
                {
                    "id": pid,
                    "name": provider["name"],
                    "family": provider["family"],
                    "concurrency": provider["concurrency"],
                    "active_slots": active_slots[pid],
                    "available_slots": max(0, provider["concurrency"] - active_slots[pid]),
                    **counts,
                    "paused": provider["paused"],
                    "paused_reason": provider["paused_reason"],
                    "cooling_down_until": cooling.isoformat() if cooling else None,
                    "oldest_queued_age_seconds": (now - provider_oldest[pid]).total_seconds() if pid in provider_oldest else None,
                    "waiting_reasons": dict(waiting_reasons.get(pid, {})),
                    "warning": _provider_warning(counts, live),
                    **_polling(lag.get(pid)),
                }
            )
        rows.sort(key=lambda r: (-(r["active_slots"] + r["queued"] + r["waiting"]), r["name"].lower(), r["id"]))
        result.update(_limited("providers", rows, limit))

    if breakdown in ("projects", "all"):
        rows = []
        for project_id, counts in per_project.items():
            project = info.get(project_id, {})
            latest = project_latest.get(project_id)
            rows.append(
                {
                    "id": project_id,
                    "name": project.get("name", ""),
                    "kind": project.get("kind", ""),
                    "provider_name": project.get("provider__name") or "",
                    **counts,
                    "latest_job_at": latest.isoformat() if latest else None,
                }
            )
        rows.sort(key=lambda r: (-(r["processing"] + r["pending"]), -(_ts(r["latest_job_at"]))))
        health = runner_health({row["id"] for row in rows if row["kind"] in runner_registry.RUNNERS}, now=now)
        for row in rows:
            row["instance_warning"] = (health.get(row["id"]) or {}).get("message", "")
        result["instances"] = sorted(health.values(), key=lambda h: (h["reachable"], h["project_name"].lower()))
        result.update(_limited("projects", rows, limit))
    return result


def runner_health(project_ids, now=None) -> dict:
    """{project_id: instance health} for projects a runner drives (ComfyUI): reachability
    and, when down, "instance unreachable since … — in-flight jobs fail at …"."""
    return runner_registry.health(project_ids, now=now)


def _ts(value: str | None) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value).timestamp() if value else 0.0


def _limited(key: str, rows: list, limit: int | None) -> dict:
    total = len(rows)
    if limit is not None:
        rows = rows[:limit]
    return {key: rows, f"{key}_total": total, f"{key}_has_more": total > len(rows)}


def _polling(lag: dict | None) -> dict:
    lag = lag or {}
    return {
        "polling_behind": lag.get("behind", 0),
        "polling_message": lag.get("message", ""),
        "poll_cycle_seconds": lag.get("cycle_seconds"),
        "poll_budget_per_minute": lag.get("budget_per_minute"),
    }


def _provider_warning(counts: dict, live: dict) -> str:
    """A provider with work that nobody alive will move (bull-board's "no workers" badge)."""
    if counts["pending"] and not live["workers"]:
        return "dispatchable work but no live worker cluster"
    if counts["detached"] and not live["queue_services"]:
        return "detached jobs are not polled: no live queue service"
    return ""


def _warnings(live: dict, totals: dict) -> list[str]:
    warnings = []
    if totals["pending"] and not live["workers"]:
        warnings.append("Jobs are waiting but no worker cluster is alive: start `manage.py qcluster`.")
    if (totals["pending"] or totals["detached"]) and not live["queue_services"]:
        warnings.append(
            "No queue service is alive: detached jobs are not polled and nothing heals; start `manage.py queue_service`."
        )
    return warnings


JOB_FILTER_STATES = (
    "active",  # pending, processing and failed: the queue (the default)
    "waiting",
    "queued",
    "running",
    "stalled",
    "detached",
    "pending",
    "processing",
    "failed",
    "cancelled",  # failed with reason "cancelled"
    "completed",
    "draft",
    "all",
)


MAX_PER_PAGE = 200


def job_state(job: Job, *, providers: dict, live: dict, now) -> tuple[str, str]:
    """(derived state, why it waits) of one job; the job needs its project loaded."""
    return states.of_job(job, providers=providers, live=live, now=now)


def job_row(job: Job, *, providers: dict, live: dict, now, attempts=None, health: dict | None = None) -> dict:
    """A job as the monitor, the project page and the API show it. `health`
    (runner_health) names an unreachable instance on its waiting and in-flight jobs."""
    state, reason = job_state(job, providers=providers, live=live, now=now)
    instance = (health or {}).get(job.project_id) or {}
    warning = instance.get("message", "") if job.status in (Status.PENDING, Status.PROCESSING) else ""
    reason = warning or reason
    snap = job.resolved or {}
    provider_id = snap.get("provider_id") if job.status != Status.PENDING and snap else None
    provider_id = provider_id or job.active_provider_id or job.provider_id or job.project.provider_id
    provider = providers.get(provider_id) or {}

    def setting(name):
        return snap.get(name) if snap.get(name) not in (None, "") else (getattr(job, name) or getattr(job.project, name))

    row = {
        "id": str(job.id),
        "short_id": str(job.id)[:8],
        "project_id": job.project_id,
        "project_name": job.project.name,
        "project_kind": job.project.kind,
        "status": job.status,
        "state": state,
        "waiting_reason": reason,
        "provider_id": provider_id,
        "provider_name": provider.get("name") or snap.get("provider_name") or "",
        "family": provider.get("family") or snap.get("family") or "",
        "model": snap.get("model") or job.model or job.project.model,
        "prompt": job.prompt,
        "aspect_ratio": setting("aspect_ratio"),
        "quality": setting("quality"),
        "resolution": setting("resolution"),
        "format": setting("format"),
        "duration": setting("duration"),
        "sound": setting("sound"),
        "attempts": job.attempts,
        "error": job.error,
        "error_class": job.error_class,
        "task_id": job.task_id,
        "progress": job.progress,
        "instance_warning": warning,
        "backoff_until": job.not_before.isoformat() if job.not_before and job.not_before > now else None,
        "created_at": job.created_at.isoformat() if job.created_at else None,
        "queued_at": job.queued_at.isoformat() if job.queued_at else None,
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }
    if attempts is not None:
        row["attempt_log"] = [
            {
                "number": a.number,
                "worker": a.worker,
                "started_at": a.started_at.isoformat() if a.started_at else None,
                "finished_at": a.finished_at.isoformat() if a.finished_at else None,
                "outcome": a.outcome,
                "reason": a.reason,
                "task_id": a.task_id,
            }
            for a in attempts
        ]
    return row


def jobs_page(
    *,
    user,
    state: str = "active",
    provider_id: int | None = None,
    project_id: int | None = None,
    model: str = "",
    error: str = "",
    search: str = "",
    page: int = 1,
    per_page: int = 50,
    with_attempts: bool = True,
    now=None,
    providers: dict | None = None,
    live: dict | None = None,
    count_limit: int | None = None,
    known_total: int | None = None,
) -> dict:
    """One page of the jobs a user may see, filtered, each with its derived state and why
    it waits. Constant queries: providers, heartbeats, a count, the page, its attempts
    (callers that already hold `providers` and `live` pass them in and save two)."""
    now = now or timezone.now()
    providers = visible_providers(user) if providers is None else providers
    live = heartbeats.liveness(now=now) if live is None else live
    per_page = max(1, min(int(per_page), MAX_PER_PAGE))
    state = state if state in JOB_FILTER_STATES else "active"
    jobs = visible_jobs(user).annotate(eff_provider=states.effective_provider_sql())
    jobs = jobs.filter(states.condition(state, providers=providers, live=live, now=now))
    if provider_id is not None:
        jobs = jobs.filter(eff_provider=provider_id)
    if project_id is not None:
        jobs = jobs.filter(project_id=project_id)
    if model:
        jobs = jobs.filter(Q(model__icontains=model) | Q(model="", project__model__icontains=model))
    if error:
        jobs = jobs.filter(error__icontains=error)
    if search:
        from queue_app.selectors.search import search_condition  # prompt, job id, task id

        jobs = jobs.filter(search_condition(search))
    if known_total is not None:
        # the caller already counted these (queue_status's totals): no second count
        total, total_capped = known_total, False
    elif count_limit:
        # Counting every match of a broad filter costs more than the page itself; past
        # the limit the list says "10,000+" and pages through the first ones.
        total = jobs.order_by()[: count_limit + 1].count()
        total_capped = total > count_limit
        total = min(total, count_limit)
    else:
        total, total_capped = jobs.count(), False
    pages = max(1, -(-total // per_page))
    page = max(1, min(int(page), pages))
    offset = (page - 1) * per_page
    chunk = list(jobs.select_related("project").order_by("-created_at", "-id")[offset : offset + per_page])
    # One query for the page's attempts, in the order a job lists them. Not
    # prefetch_related: the attempts' default ordering ("job" first) joined every one to
    # its job to sort by the job's creation, and it built a queryset per job.
    attempts = defaultdict(list)
    if with_attempts and chunk:
        for attempt in JobAttempt.objects.filter(job_id__in=[job.id for job in chunk]).order_by("job_id", "number", "id"):
            attempts[attempt.job_id].append(attempt)
    health = runner_health({job.project_id for job in chunk if job.project.kind in runner_registry.RUNNERS}, now=now)
    rows = [
        job_row(job, providers=providers, live=live, now=now, attempts=attempts[job.id] if with_attempts else None, health=health)
        for job in chunk
    ]
    return {
        "jobs": rows,
        "total": total,
        "total_capped": total_capped,
        "page": page,
        "pages": pages,
        "per_page": per_page,
        "has_next": page < pages,
        "has_previous": page > 1,
        "state": state,
    }
