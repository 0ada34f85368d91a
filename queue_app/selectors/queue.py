"""The queue's numbers: queue_status (totals, per provider, per project), shared by the
monitor, the API, MCP, metrics and `manage.py queue_status`, at a constant number of queries."""

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import BooleanField, Case, Count, Max, Min, Q, Value, When
from django.utils import timezone

from queue_app.engine import heartbeats, runner_registry
from queue_app.models import Project, Status
from queue_app.selectors import fair_share, states
from queue_app.selectors.polling import poll_lag
from queue_app.selectors.visibility import visible_jobs, visible_providers

COUNT_KEYS = ("pending", "processing", "failed", "queued", "waiting", "running", "stalled", "detached")


def _flag(condition: Q):
    return Case(When(condition, then=Value(True)), default=Value(False), output_field=BooleanField())


def _empty_counts() -> dict:
    return {key: 0 for key in COUNT_KEYS}


def queue_status(
    *, user, breakdown: str = "none", limit: int | None = None, now=None, providers: dict | None = None, live: dict | None = None
) -> dict:
    """Totals, and per provider / per project rows when `breakdown` asks for them
    ("none", "projects", "providers" or "all"). Staff see everyone's queue. A caller that
    also lists jobs passes the `providers` and `live` it already read."""
    now = now or timezone.now()
    live = heartbeats.liveness(now=now) if live is None else live
    providers = visible_providers(user) if providers is None else providers
    groups, projects = _open_job_groups(user, now)
    tally = _Tally(providers=providers, live=live, now=now)
    for row in groups:
        tally.add(row, projects.get(row["project_id"]) or {})
    lag = poll_lag([pid for pid in providers if tally.per_provider[pid]["detached"]], now=now)
    result = _summary(tally, lag, breakdown)
    if breakdown in ("providers", "all"):
        result.update(_limited("providers", _provider_rows(tally, lag), limit))
    if breakdown in ("projects", "all"):
        rows, instances = _project_rows(tally, projects)
        result["instances"] = instances
        result.update(_limited("projects", rows, limit))
    return result


def _open_job_groups(user, now) -> tuple[list[dict], dict]:
    """The open jobs (pending, processing, failed) counted by project, provider, status and
    derived sub-state, and the projects they belong to: two queries."""
    jobs = visible_jobs(user).filter(status__in=(Status.PENDING, Status.PROCESSING, Status.FAILED))
    # Grouped by the bare columns, without joining the projects: the partial covering
    # index job_open_counts answers it from the index alone. COUNT(*), not COUNT(id): the
    # id is not in that index. The project's kind and provider come from one small query.
    groups = list(
        jobs.annotate(processing_state=states.processing_state_sql(now), backoff=_flag(states.in_backoff_sql(now)))
        .values("project_id", "provider_id", "active_provider_id", "status", "processing_state", "backoff")
        .annotate(n=Count("*"), oldest=Min("queued_at"), latest=Max("updated_at"))
        .order_by()
    )
    projects = {
        row["id"]: row
        for row in Project.objects.filter(id__in={row["project_id"] for row in groups}).values(
            "id", "name", "kind", "provider_id", "provider__name"
        )
    }
    return groups, projects


RETRY_BACKOFF = "retry backoff"  # states.waiting_reason's words for a job in backoff, counted


@dataclass
class _Tally:
    """The grouped rows added up: totals, per provider, per project, and the oldest
    dispatchable job of each provider and of the whole queue."""

    providers: dict
    live: dict
    now: datetime
    totals: dict = field(default_factory=_empty_counts)
    per_provider: dict = field(default_factory=lambda: defaultdict(_empty_counts))
    per_project: dict = field(default_factory=lambda: defaultdict(_empty_counts))
    provider_oldest: dict = field(default_factory=dict)
    project_latest: dict = field(default_factory=dict)
    waiting_reasons: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    # per provider: (queued_at, reason code) of its oldest pending job, whatever blocks it
    pending_oldest: dict = field(default_factory=dict)
    # per provider: slots held per project name, and the projects with work there
    holders: dict = field(default_factory=lambda: defaultdict(Counter))
    contenders: dict = field(default_factory=lambda: defaultdict(set))
    oldest_queued: datetime | None = None

    def add(self, row: dict, project: dict) -> None:
        n, status = row["n"], row["status"]
        provider_id = states.effective_provider_of(
            status=status,
            active_provider_id=row["active_provider_id"],
            provider_id=row["provider_id"],
            project_provider_id=project.get("provider_id"),
        )
        keys = [status]
        if status in (Status.PENDING, Status.PROCESSING) and provider_id:
            self.contenders[provider_id].add(row["project_id"])
        if status == Status.PROCESSING and provider_id:
            self.holders[provider_id][project.get("name", "")] += n
        if status == Status.PENDING:
            keys.append(self._pending_key(row, provider_id, project.get("kind", "")))
        elif status == Status.PROCESSING:
            keys.append(states.runner_aware(row["processing_state"], project.get("kind", "")))
        for key in keys:
            self.totals[key] += n
            self.per_project[row["project_id"]][key] += n
            if provider_id in self.providers:
                self.per_provider[provider_id][key] += n
        latest = self.project_latest.get(row["project_id"])
        if row["latest"] and (latest is None or row["latest"] > latest):
            self.project_latest[row["project_id"]] = row["latest"]

    def _pending_key(self, row: dict, provider_id, kind: str) -> str:
        """ "waiting" (counted under its reason) or "queued" (its age kept)."""
        provider = self.providers.get(provider_id)
        reason = states.waiting_reason(provider=provider, kind=kind, backoff=row["backoff"], live=self.live, now=self.now)
        oldest = row["oldest"]
        if oldest and (provider_id not in self.pending_oldest or oldest < self.pending_oldest[provider_id][0]):
            self.pending_oldest[provider_id] = (oldest, states.reason_code(reason))
        if reason:
            self.waiting_reasons[provider_id][reason] += row["n"]
            return "waiting"
        if oldest and (self.oldest_queued is None or oldest < self.oldest_queued):
            self.oldest_queued = oldest
        if provider_id and oldest:
            current = self.provider_oldest.get(provider_id)
            self.provider_oldest[provider_id] = min(current, oldest) if current else oldest
        return "queued"

    def active_slots(self, provider_id) -> int:
        return self.per_provider[provider_id]["processing"]


def _summary(tally: _Tally, lag: dict, breakdown: str) -> dict:
    """The totals with slots, ages and polling, and the warnings for the whole queue."""
    providers, now, totals = tally.providers, tally.now, tally.totals
    totals.update(
        projects=len(tally.per_project),
        providers=len(providers),
        active_slots=sum(tally.active_slots(pid) for pid in providers),
        concurrency=sum(p["concurrency"] for p in providers.values()),
        oldest_queued_age_seconds=(now - tally.oldest_queued).total_seconds() if tally.oldest_queued else None,
        polling_behind=sum(row["behind"] for row in lag.values()),
    )
    totals["available_slots"] = max(0, totals["concurrency"] - totals["active_slots"])
    return {
        "updated_at": now.isoformat(),
        "breakdown": breakdown,
        "totals": totals,
        "liveness": tally.live,
        "warnings": _warnings(tally.live, totals)
        + [f"{providers[pid]['name']}: {row['message']}." for pid, row in lag.items() if row["message"]],
    }


def _provider_rows(tally: _Tally, lag: dict) -> list[dict]:
    """One row per visible provider, the busiest first."""
    now, rows = tally.now, []
    for pid, provider in tally.providers.items():
        counts, active = tally.per_provider[pid], tally.active_slots(pid)
        cooling = provider["cooldown_until"] if provider["cooldown_until"] and provider["cooldown_until"] > now else None
        oldest = tally.provider_oldest.get(pid)
        pending_since, blocked_by = tally.pending_oldest.get(pid, (None, "none"))
        rows.append(
            {
                "id": pid,
                "name": provider["name"],
                "family": provider["family"],
                "concurrency": provider["concurrency"],
                "active_slots": active,
                "available_slots": max(0, provider["concurrency"] - active),
                **counts,
                "paused": provider["paused"],
                "paused_reason": provider["paused_reason"],
                "cooling_down_until": cooling.isoformat() if cooling else None,
                "oldest_queued_age_seconds": (now - oldest).total_seconds() if oldest else None,
                "oldest_pending_age_seconds": (now - pending_since).total_seconds() if pending_since else None,
                "oldest_pending_reason": blocked_by,
                "waiting_reasons": dict(tally.waiting_reasons.get(pid, {})),
                "in_backoff": tally.waiting_reasons.get(pid, {}).get(RETRY_BACKOFF, 0),
                "fair_share": fair_share.note(
                    concurrency=provider["concurrency"],
                    holders=tally.holders.get(pid),
                    contending=len(tally.contenders.get(pid, ())) > 1 and counts["queued"] > 0,
                ),
                "warning": _provider_warning(counts, tally.live),
                **_polling(lag.get(pid)),
            }
        )
    rows.sort(key=lambda r: (-(r["active_slots"] + r["queued"] + r["waiting"]), r["name"].lower(), r["id"]))
    return rows


def _project_rows(tally: _Tally, projects: dict) -> tuple[list[dict], list[dict]]:
    """One row per project with open jobs, the busiest first, and the health of the
    instances (ComfyUI) those projects run on."""
    rows = []
    for project_id, counts in tally.per_project.items():
        project = projects.get(project_id, {})
        latest = tally.project_latest.get(project_id)
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
    health = runner_health({row["id"] for row in rows if row["kind"] in runner_registry.RUNNERS}, now=tally.now)
    for row in rows:
        row["instance_warning"] = (health.get(row["id"]) or {}).get("message", "")
    instances = sorted(health.values(), key=lambda h: (h["reachable"], h["project_name"].lower()))
    return rows, instances


def runner_health(project_ids, now=None) -> dict:
    """{project_id: instance health} for projects a runner drives (ComfyUI): reachability
    and, when down, "instance unreachable since … — in-flight jobs fail at …"."""
    return runner_registry.health(project_ids, now=now)


def _ts(value: str | None) -> float:
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
