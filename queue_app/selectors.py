"""The queue status: one selector, from the database alone.

The Queue Monitor, the JSON API, the MCP tools and `manage.py queue_status` all call
`queue_status`. It runs a constant number of queries whatever the number of jobs: one
grouped aggregation over unfinished and failed jobs, one over providers, one over the
projects that appear, one over heartbeats.

Derived states (Waiting, Queued, Running, Stalled, Detached and the waiting reason) are
defined once, SQL beside Python, in queue_app/states.py; this module only applies them.
Ownership ("this user may see / change this row") is `visible_to` / `may_see` below.
"""

from collections import defaultdict

from django.db.models import BooleanField, Case, Count, Max, Min, Q, Value, When
from django.utils import timezone

from queue_app import states
from queue_app.engine import heartbeats, runners
from queue_app.models import AlbumItem, ErrorClass, Job, Project, Provider, Status

COUNT_KEYS = ("pending", "processing", "failed", "queued", "waiting", "running", "stalled", "detached")


def _flag(condition: Q):
    return Case(When(condition, then=Value(True)), default=Value(False), output_field=BooleanField())


waiting_reason = states.waiting_reason  # the public name callers know


def visible_to(user, model):
    """The one ownership rule: the rows of `model` (Job, Project, Provider, AlbumItem:
    anything with an owner) a user may see and change — their own; staff everyone's."""
    return model.objects.all() if user.is_staff else model.objects.filter(owner=user)


def may_see(user, row) -> bool:
    """`visible_to` for a row already loaded (no query)."""
    return user.is_staff or row.owner_id == user.id


def visible_jobs(user):
    """The jobs a user may see: their own; staff see everyone's."""
    return visible_to(user, Job)


def visible_providers(user) -> dict:
    """{id: row} of every provider record the user may see (idle ones too), one query."""
    providers_qs = visible_to(user, Provider)
    return {
        row["id"]: row
        for row in providers_qs.values(
            "id", "name", "family", "concurrency", "paused", "paused_reason", "cooldown_until", "created_at"
        )
    }


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
    groups = (
        jobs.annotate(
            bucket_provider=states.effective_provider_sql(),
            processing_state=states.processing_state_sql(now),
            backoff=_flag(states.in_backoff_sql(now)),
        )
        .values("project_id", "project__kind", "bucket_provider", "status", "processing_state", "backoff")
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
                    "paused_reason": provider["paused_reason"],
                    "cooling_down_until": cooling.isoformat() if cooling else None,
                    "oldest_queued_age_seconds": (now - provider_oldest[pid]).total_seconds() if pid in provider_oldest else None,
                    "waiting_reasons": dict(waiting_reasons.get(pid, {})),
                    "warning": _provider_warning(counts, live),
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
        health = runner_health({row["id"] for row in rows if row["kind"] in runners.RUNNERS}, now=now)
        for row in rows:
            row["instance_warning"] = (health.get(row["id"]) or {}).get("message", "")
        result["instances"] = sorted(health.values(), key=lambda h: (h["reachable"], h["project_name"].lower()))
        result.update(_limited("projects", rows, limit))
    return result


def runner_health(project_ids, now=None) -> dict:
    """{project_id: instance health} for projects a runner drives (ComfyUI): reachability
    and, when down, "instance unreachable since … — in-flight jobs fail at …"."""
    return runners.health(project_ids, now=now)


def _ts(value: str | None) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value).timestamp() if value else 0.0


def _limited(key: str, rows: list, limit: int | None) -> dict:
    total = len(rows)
    if limit is not None:
        rows = rows[:limit]
    return {key: rows, f"{key}_total": total, f"{key}_has_more": total > len(rows)}


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


# --- The job list ---------------------------------------------------------------------

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
        from queue_app.selectors_search import search_condition  # prompt, job id, task id

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
    chunk = jobs.select_related("project").order_by("-created_at", "-id")[offset : offset + per_page]
    if with_attempts:
        chunk = chunk.prefetch_related("attempt_log")
    chunk = list(chunk)
    health = runner_health({job.project_id for job in chunk if job.project.kind in runners.RUNNERS}, now=now)
    rows = [
        job_row(
            job, providers=providers, live=live, now=now, attempts=job.attempt_log.all() if with_attempts else None, health=health
        )
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


# --- Projects and storage (the project pages, the account page, the API) -----------------


def own_projects(user, *, archived: bool | None = False) -> list[Project]:
    """The user's projects with `.counts` ({status: n}), newest first. `archived`: False
    hides archived ones (the default list), True lists only them, None lists all."""
    projects_qs = Project.objects.filter(owner=user).select_related("provider")
    if archived is not None:
        projects_qs = projects_qs.filter(archived=archived)
    projects = list(projects_qs)
    counts: dict = {}
    for project_id, job_status, n in (
        Job.objects.filter(project__in=projects).values_list("project_id", "status").annotate(n=Count("id")).order_by()
    ):
        counts.setdefault(project_id, {})[job_status] = n
    for project in projects:
        project.counts = counts.get(project.id, {})
    return projects


def project_footprint(project: Project) -> dict:
    """What deleting a project removes: jobs (and how many run now), album items, bytes."""
    from django.db.models import Sum

    from queue_app.models import AlbumItem

    album = AlbumItem.objects.filter(project=project).aggregate(n=Count("id"), total=Sum("size"))
    return {
        "jobs": Job.objects.filter(project=project).count(),
        "processing": Job.objects.filter(project=project, status=Status.PROCESSING).count(),
        "album_items": album["n"] or 0,
        "bytes": album["total"] or 0,
    }


def project_running_job_ids(project: Project, *, limit: int = 500) -> list[str]:
    return [str(i) for i in Job.objects.filter(project=project, status=Status.PROCESSING).values_list("id", flat=True)[:limit]]


def project_json(project: Project) -> dict:
    return {
        "id": project.id,
        "name": project.name,
        "kind": project.kind,
        "provider_id": project.provider_id,
        "model": project.model,
        "archived": project.archived,
        "defaults": {
            name: getattr(project, name)
            for name in (
                "aspect_ratio",
                "quality",
                "resolution",
                "format",
                "background",
                "duration",
                "sound",
                "system_prompt",
                "temperature",
                "max_tokens",
            )
        },
        "counts": getattr(project, "counts", None),
        "created_at": project.created_at.isoformat(),
        "updated_at": project.updated_at.isoformat(),
    }


def storage_summary(user, *, project: Project | None = None) -> dict:
    """Album usage against the user's limit, and what starting jobs would reserve under
    the estimate rule (JOB_STORAGE_ESTIMATE_BYTES per pending job). `fits_now` is how many
    more jobs a start may take; with a project, `project_bytes` and `drafts` are its own."""
    from django.conf import settings
    from django.db.models import Sum

    from queue_app.engine import outputs
    from queue_app.models import AlbumItem

    used = outputs.usage_bytes(user.id)
    limit = outputs.storage_limit(user.id)
    per_job = settings.JOB_STORAGE_ESTIMATE_BYTES
    pending = Job.objects.filter(owner=user, status=Status.PENDING).count()
    reserved = pending * per_job
    summary = {
        "used_bytes": used,
        "limit_bytes": limit,
        "per_job_bytes": per_job,
        "pending": pending,
        "reserved_bytes": reserved,
        "free_bytes": max(0, limit - used - reserved),
        "fits_now": max(0, (limit - used - reserved) // per_job) if per_job else 10**9,
        "percent": min(100, round(100 * (used + reserved) / limit)) if limit else 100,
    }
    if project is not None:
        drafts = Job.objects.filter(project=project, status=Status.DRAFT).count()
        summary["project_bytes"] = AlbumItem.objects.filter(project=project).aggregate(total=Sum("size"))["total"] or 0
        summary["drafts"] = drafts
        summary["start_all_bytes"] = drafts * per_job
    return summary


def provider_json(provider: Provider) -> dict:
    """A provider as the API shows it: never the key, at most its last four characters."""
    return {
        "id": provider.id,
        "owner_id": provider.owner_id,
        "name": provider.name,
        "family": provider.family,
        "base_url": provider.base_url,
        "key_hint": provider.api_key_hint,
        "has_key": bool(provider.api_key_encrypted),
        "concurrency": provider.concurrency,
        "max_attempts": provider.max_attempts,
        "paused": provider.paused,
        "paused_reason": provider.paused_reason,
        "cooldown_until": provider.cooldown_until.isoformat() if provider.cooldown_until else None,
        "options": provider.options,
        "model_aliases": provider.model_aliases,
        "created_at": provider.created_at.isoformat(),
    }


def provider_visible(user, provider_id) -> Provider | None:
    """A provider the user may see (their own; staff: anyone's), or None."""
    if isinstance(provider_id, bool) or not isinstance(provider_id, int) or not 1 <= provider_id < 2**63:
        return None
    providers_qs = Provider.objects.all() if user.is_staff else Provider.objects.filter(owner=user)
    return providers_qs.filter(id=provider_id).first()


PROJECT_CHOICES_LIMIT = 300


def project_choices(user, *, selected: int | None = None) -> list[tuple[int, str]]:
    """(id, name) of the projects a user may filter the monitor by (staff: everyone's),
    by name; the selected one is always among them even past the limit."""
    projects_qs = Project.objects.all() if user.is_staff else Project.objects.filter(owner=user)
    choices = list(projects_qs.filter(archived=False).order_by("name", "id").values_list("id", "name")[:PROJECT_CHOICES_LIMIT])
    if selected is not None and selected not in {project_id for project_id, _ in choices}:
        choices += list(projects_qs.filter(id=selected).values_list("id", "name"))
    return choices


# --- Drafts (issue 12) ------------------------------------------------------------------


def project_drafts(project):
    """A project's drafts, oldest first (the page pages through them)."""
    return project.jobs.filter(status=Status.DRAFT).select_related("provider").order_by("created_at", "id")


def draft_providers(user, kind: str) -> list:
    """The user's providers whose family makes `kind` outputs (a draft may pick one)."""
    from queue_app.providers.catalogue import CATALOGUE

    return [
        provider
        for provider in Provider.objects.filter(owner=user)
        if any(spec.kind == kind for spec in CATALOGUE.get(provider.family, {}).values())
    ]


def album_images(project, limit: int = 60) -> list:
    """The project's newest album images, for the reference picker."""
    return list(
        AlbumItem.objects.filter(project=project, kind=AlbumItem.ItemKind.IMAGE)
        .exclude(file="")
        .order_by("-created_at", "id")[:limit]
    )


def reference_of(user, sha256: str):
    """An uploaded reference image the user may see (their own; staff: anyone's)."""
    from queue_app.models import Reference

    rows = Reference.objects.all() if user.is_staff else Reference.objects.filter(owner=user)
    return rows.filter(sha256=sha256).first()


# --- The job page and the album ---------------------------------------------------------

LAYER_ROLES = ("layer",)
SNAPSHOT_FIELDS = (
    ("provider_name", "Provider"),
    ("family", "Family"),
    ("kind", "Kind"),
    ("model", "Model"),
    ("aspect_ratio", "Aspect ratio"),
    ("resolution", "Resolution"),
    ("quality", "Quality"),
    ("format", "Format"),
    ("background", "Background"),
    ("duration", "Duration (s)"),
    ("sound", "Sound"),
    ("temperature", "Temperature"),
    ("max_tokens", "Max tokens"),
    ("system_prompt", "System prompt"),
)


def album_grouped(items) -> list[dict]:
    """Album items grouped under their job, in the order given: the base image(s) first,
    its layers under it."""
    groups: dict = {}
    for item in items:
        key = item.job_id or f"item-{item.id}"
        group = groups.setdefault(key, {"job_id": item.job_id, "prompt": item.prompt, "main": [], "layers": []})
        (group["layers"] if item.role in LAYER_ROLES else group["main"]).append(item)
    return list(groups.values())


def album_counts(project) -> dict:
    """{"items": outputs that are not layers, "layers": layers} — the album's headline."""
    from queue_app.models import AlbumItem

    layers = Q(role__in=LAYER_ROLES)
    counts = AlbumItem.objects.filter(project=project).aggregate(
        items=Count("id", filter=~layers), layers=Count("id", filter=layers)
    )
    return {"items": counts["items"] or 0, "layers": counts["layers"] or 0}


def album_zip_items(project):
    """Every album item of a project for the zip download, oldest first, one row at a time."""
    from queue_app.models import AlbumItem

    return AlbumItem.objects.filter(project=project).order_by("created_at", "job_id", "output_index", "id").iterator(100)


def job_detail(job: Job, *, user, now=None) -> dict:
    """Everything the job page shows: the row the monitor shows (with the attempt log),
    the resolved snapshot, and the job's album items (layers grouped under the base)."""
    now = now or timezone.now()
    providers = visible_providers(user)
    live = heartbeats.liveness(now=now)
    attempts = list(job.attempt_log.order_by("number", "id"))
    row = job_row(job, providers=providers, live=live, now=now, attempts=attempts)
    snap = job.resolved or {}
    snapshot = [(label, snap.get(key)) for key, label in SNAPSHOT_FIELDS if snap.get(key) not in (None, "")]
    if snap.get("model_alias_of"):  # an alias reads as what it resolved to
        snapshot = [(label, f"{value} → {snap['model_alias_of']}" if label == "Model" else value) for label, value in snapshot]
    outputs = list(job.album_items.order_by("output_index", "id"))
    return {
        "job": job,
        "row": row,
        "attempts": attempts,
        "snapshot": snapshot,
        "params": snap.get("params") or job.params or {},
        "resolved": bool(snap),
        "outputs": album_grouped(outputs),
        "output_count": len(outputs),
        "retryable": job.status == Status.FAILED,
    }


# --- Agents: projects, providers and one job (the MCP list/get tools) --------------------


def visible_projects(user):
    """The projects a user may see: their own; staff see everyone's (as visible_jobs)."""
    return Project.objects.all() if user.is_staff else Project.objects.filter(owner=user)


def _project_row(project: Project) -> dict:
    return {
        "id": project.id,
        "name": project.name,
        "kind": project.kind,
        "provider_id": project.provider_id,
        "model": project.model,
        "aspect_ratio": project.aspect_ratio,
        "quality": project.quality,
        "resolution": project.resolution,
        "format": project.format,
        "duration": project.duration,
        "created_at": project.created_at.isoformat(),
    }


def projects_after(*, user, after_id: int = 0, limit: int = 50) -> dict:
    """One page of projects by id (keyset: the cost is the page, never the offset)."""
    rows = list(visible_projects(user).filter(id__gt=after_id).order_by("id")[: limit + 1])
    page = [_project_row(project) for project in rows[:limit]]
    return {"projects": page, "next_after": page[-1]["id"] if len(rows) > limit else None}


def project_detail(*, user, project_id: int) -> dict | None:
    """A project with its job counts per status (one grouped query)."""
    project = visible_projects(user).filter(id=project_id).first()
    if project is None:
        return None
    counts = dict(Job.objects.filter(project=project).values_list("status").annotate(n=Count("id")).order_by())
    return {**_project_row(project), "jobs": {status: counts.get(status, 0) for status in Status.values}}


def providers_after(*, user, after_id: int = 0, limit: int = 50) -> dict:
    """One page of provider records by id, with their active slots (two queries)."""
    providers = Provider.objects.all() if user.is_staff else Provider.objects.filter(owner=user)
    rows = list(providers.filter(id__gt=after_id).order_by("id")[: limit + 1])
    page = rows[:limit]
    active = dict(
        Job.objects.filter(status=Status.PROCESSING, active_provider_id__in=[p.id for p in page])
        .values_list("active_provider_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    now = timezone.now()
    items = [
        {
            "id": p.id,
            "name": p.name,
            "family": p.family,
            "paused": p.paused,
            "paused_reason": p.paused_reason,
            "cooling_down": bool(p.cooldown_until and p.cooldown_until > now),
            "concurrency": p.concurrency,
            "max_attempts": p.max_attempts,
            "active_slots": active.get(p.id, 0),
            "key_set": bool(p.api_key_encrypted),
        }
        for p in page
    ]
    return {"providers": items, "next_after": page[-1].id if len(rows) > limit else None}


def job_summary(*, user, job_id) -> dict | None:
    """One job as the job page shows it: its row (derived state, resolved settings),
    attempts and album outputs."""
    job = visible_jobs(user).select_related("project").filter(id=job_id).first()
    if job is None:
        return None
    now = timezone.now()
    row = job_row(
        job, providers=visible_providers(user), live=heartbeats.liveness(now=now), now=now, attempts=job.attempt_log.all()
    )
    row["resolved"] = job.resolved
    row["outputs"] = [
        {
            "id": item.id,
            "index": item.output_index,
            "role": item.role,
            "kind": item.kind,
            "content_type": item.content_type,
            "size": item.size,
            "width": item.width,
            "height": item.height,
            "text": item.text if item.kind == "text" else None,
            "has_file": bool(item.file),
        }
        for item in job.album_items.order_by("output_index")
    ]
    return row


def jobs_by_status(job_ids) -> dict:
    """{status: count} of these jobs (one grouped query): what start_jobs' wait watches."""
    rows = Job.objects.filter(id__in=list(job_ids)).values_list("status").annotate(n=Count("id")).order_by()
    return {status: n for status, n in rows}


# --- Needs attention (issue 16): held ambiguous submissions (engine/ambiguous.py) ---

ATTENTION_ROWS = 50


def attention_jobs(user, *, limit: int = ATTENTION_ROWS) -> dict:
    """Jobs held for attention that `user` may act on, newest first, and how many in all."""
    jobs = visible_jobs(user).filter(status=Status.FAILED, error_class=ErrorClass.ATTENTION)
    rows = jobs.order_by("-finished_at", "-id").values(
        "id", "prompt", "error", "finished_at", "project_id", "project__name", "provider__name", "project__provider__name"
    )[:limit]
    return {"count": jobs.count(), "jobs": list(rows)}
