"""The queue status: one selector, from the database alone.

The Queue Monitor, the JSON API, the MCP tools and `manage.py queue_status` all call
`queue_status`. It runs a constant number of queries whatever the number of jobs: one
grouped aggregation over unfinished and failed jobs, one over providers, one over the
projects that appear, one over heartbeats.

Derived states (ARCHITECTURE "Job states"):
- Waiting — pending, but nothing will dispatch it now: provider paused or cooling down,
  retry backoff not elapsed, no usable provider, or no live worker to take it;
- Queued — pending and dispatchable, waiting for a slot;
- Running — processing without a remote task id under a live lease;
- Stalled — processing without a task id whose lease expired (healing returns it);
- Detached — processing with a remote task id; it keeps its slot while polled.
"""

from collections import defaultdict

from django.db.models import BooleanField, Case, Count, Max, Min, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from queue_app import heartbeats, runners
from queue_app.models import Job, Project, Provider, Status

COUNT_KEYS = ("pending", "processing", "failed", "queued", "waiting", "running", "stalled", "detached")


def _flag(condition: Q):
    return Case(When(condition, then=Value(True)), default=Value(False), output_field=BooleanField())


def waiting_reason(*, provider: dict | None, kind: str, backoff: bool, live: dict, now) -> str:
    """Why a pending job would not be dispatched right now ('' when it is Queued)."""
    if kind in runners.RUNNERS:
        return "" if live["queue_services"] else "no live queue service"
    if provider is None:
        return "no provider"
    if provider["paused"]:
        return "provider paused"
    if provider["cooldown_until"] and provider["cooldown_until"] > now:
        return f"cooling down until {provider['cooldown_until']:%H:%M:%S}"
    if backoff:
        return "retry backoff"
    if not live["workers"]:
        return "no live worker"
    return ""


def _empty_counts() -> dict:
    return {key: 0 for key in COUNT_KEYS}


def queue_status(*, user, breakdown: str = "none", limit: int | None = None, now=None) -> dict:
    """Totals, and per provider / per project rows when `breakdown` asks for them
    ("none", "projects", "providers" or "all"). Staff see everyone's queue."""
    now = now or timezone.now()
    jobs = Job.objects.filter(status__in=(Status.PENDING, Status.PROCESSING, Status.FAILED))
    providers_qs = Provider.objects.all()
    if not user.is_staff:
        jobs = jobs.filter(owner=user)
        providers_qs = providers_qs.filter(owner=user)
    live = heartbeats.liveness(now=now)
    providers = {
        row["id"]: row
        for row in providers_qs.values("id", "name", "family", "concurrency", "paused", "cooldown_until", "created_at")
    }
    groups = (
        jobs.annotate(
            bucket_provider=Case(
                When(status=Status.PROCESSING, then="active_provider_id"),
                default=Coalesce("provider_id", "project__provider_id"),
            ),
            detached=_flag(~Q(task_id="")),
            backoff=_flag(Q(not_before__gt=now)),
            stalled=_flag(Q(lease_expires_at__lt=now) & Q(task_id="")),
        )
        .values("project_id", "project__kind", "bucket_provider", "status", "detached", "backoff", "stalled")
        .annotate(n=Count("id"), oldest=Min("queued_at"), latest=Max("updated_at"))
        .order_by()
    )

    totals = _empty_counts()
    per_provider = defaultdict(_empty_counts)
    per_project = defaultdict(_empty_counts)
    provider_oldest: dict = {}
    project_latest: dict = {}
    waiting_reasons: dict = defaultdict(lambda: defaultdict(int))
    oldest_queued = None
    for row in groups:
        n, status = row["n"], row["status"]
        provider_id = row["bucket_provider"]
        provider = providers.get(provider_id)
        keys = [status]
        if status == Status.PENDING:
            reason = waiting_reason(provider=provider, kind=row["project__kind"], backoff=row["backoff"], live=live, now=now)
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
            keys.append("detached" if row["detached"] else ("stalled" if row["stalled"] else "running"))
        for key in keys:
            totals[key] += n
            per_project[row["project_id"]][key] += n
            if provider_id in providers:
                per_provider[provider_id][key] += n
        latest = project_latest.get(row["project_id"])
        if row["latest"] and (latest is None or row["latest"] > latest):
            project_latest[row["project_id"]] = row["latest"]

    active_slots = {pid: per_provider[pid]["processing"] for pid in providers}
    totals.update(
        projects=len(per_project),
        providers=len(providers),
        active_slots=sum(active_slots.values()),
        concurrency=sum(p["concurrency"] for p in providers.values()),
        oldest_queued_age_seconds=(now - oldest_queued).total_seconds() if oldest_queued else None,
    )
    totals["available_slots"] = max(0, totals["concurrency"] - totals["active_slots"])
    result = {
        "updated_at": now.isoformat(),
        "breakdown": breakdown,
        "totals": totals,
        "liveness": live,
        "warnings": _warnings(live, totals),
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
                    "cooling_down_until": cooling.isoformat() if cooling else None,
                    "oldest_queued_age_seconds": (now - provider_oldest[pid]).total_seconds() if pid in provider_oldest else None,
                    "waiting_reasons": dict(waiting_reasons.get(pid, {})),
                }
            )
        rows.sort(key=lambda r: (-(r["active_slots"] + r["queued"] + r["waiting"]), r["name"].lower(), r["id"]))
        result.update(_limited("providers", rows, limit))

    if breakdown in ("projects", "all"):
        info = {
            row["id"]: row
            for row in Project.objects.filter(id__in=list(per_project)).values("id", "name", "kind", "provider__name")
        }
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
        result.update(_limited("projects", rows, limit))
    return result


def _ts(value: str | None) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value).timestamp() if value else 0.0


def _limited(key: str, rows: list, limit: int | None) -> dict:
    total = len(rows)
    if limit is not None:
        rows = rows[:limit]
    return {key: rows, f"{key}_total": total, f"{key}_has_more": total > len(rows)}


def _warnings(live: dict, totals: dict) -> list[str]:
    warnings = []
    if totals["pending"] and not live["workers"]:
        warnings.append("Jobs are waiting but no worker cluster is alive: start `manage.py qcluster`.")
    if (totals["pending"] or totals["detached"]) and not live["queue_services"]:
        warnings.append(
            "No queue service is alive: detached jobs are not polled and nothing heals; start `manage.py queue_service`."
        )
    return warnings
