"""The monitor's job list: a job's row (derived state, resolved settings, attempt log),
one filtered page of rows (jobs_page), and every id a filter matches (matching_job_ids)."""

from collections import defaultdict

from django.db.models import Q
from django.utils import timezone

from queue_app.engine import heartbeats, runner_registry
from queue_app.models import Job, JobAttempt, Status
from queue_app.selectors import fair_share, states
from queue_app.selectors.queue import runner_health
from queue_app.selectors.search import search_condition
from queue_app.selectors.visibility import visible_jobs, visible_providers

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
SETTINGS = ("aspect_ratio", "quality", "resolution", "format", "duration", "sound")

MAX_PER_PAGE = 200
BULK_LIMIT = 10_000  # "all matching" acts on at most this many jobs per request
BULK_PAGE = 200


def job_state(job: Job, *, providers: dict, live: dict, now) -> tuple[str, str]:
    """(derived state, why it waits) of one job; the job needs its project loaded."""
    return states.of_job(job, providers=providers, live=live, now=now)


def _fair_share_note(state: str, providers: dict, provider_id, job: Job) -> str:
    return fair_share.job_note(providers, provider_id, job.project.name) if state == "queued" else ""


def job_row(job: Job, *, providers: dict, live: dict, now, attempts=None, health: dict | None = None) -> dict:
    """A job as the monitor, the project page and the API show it. `health`
    (runner_health) names an unreachable instance on its waiting and in-flight jobs."""
    state, reason = job_state(job, providers=providers, live=live, now=now)
    instance = (health or {}).get(job.project_id) or {}
    warning = instance.get("message", "") if job.status in (Status.PENDING, Status.PROCESSING) else ""
    snap = job.resolved or {}
    provider_id = snap.get("provider_id") if job.status != Status.PENDING and snap else None
    provider_id = provider_id or job.active_provider_id or job.provider_id or job.project.provider_id
    provider = providers.get(provider_id) or {}
    row = {
        "id": str(job.id),
        "short_id": str(job.id)[:8],
        "project_id": job.project_id,
        "project_name": job.project.name,
        "project_kind": job.project.kind,
        "status": job.status,
        "state": state,
        "waiting_reason": warning or reason or _fair_share_note(state, providers, provider_id, job),
        "provider_id": provider_id,
        "provider_name": provider.get("name") or snap.get("provider_name") or "",
        "family": provider.get("family") or snap.get("family") or "",
        "model": snap.get("model") or job.model or job.project.model,
        "prompt": job.prompt,
        **_resolved_settings(job, snap),
        "attempts": job.attempts,
        "error": job.error,
        "error_class": job.error_class,
        "task_id": job.task_id,
        "progress": job.progress,
        "instance_warning": warning,
        "backoff_until": job.not_before.isoformat() if job.not_before and job.not_before > now else None,
        **{name: _iso(getattr(job, name)) for name in ("created_at", "queued_at", "started_at", "finished_at")},
    }
    if attempts is not None:
        row["attempt_log"] = [_attempt_entry(attempt) for attempt in attempts]
    return row


def _resolved_settings(job: Job, snap: dict) -> dict:
    """Each output setting as the job runs it: the snapshot's, else the job's own, else
    its project's default."""
    return {
        name: snap.get(name) if snap.get(name) not in (None, "") else (getattr(job, name) or getattr(job.project, name))
        for name in SETTINGS
    }


def _attempt_entry(attempt: JobAttempt) -> dict:
    return {
        "number": attempt.number,
        "worker": attempt.worker,
        "started_at": _iso(attempt.started_at),
        "finished_at": _iso(attempt.finished_at),
        "outcome": attempt.outcome,
        "reason": attempt.reason,
        "task_id": attempt.task_id,
    }


def _iso(value) -> str | None:
    return value.isoformat() if value else None


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
    jobs = _filtered_jobs(
        user,
        state=state,
        provider_id=provider_id,
        project_id=project_id,
        model=model,
        error=error,
        search=search,
        providers=providers,
        live=live,
        now=now,
    )
    total, total_capped = _count(jobs, count_limit=count_limit, known_total=known_total)
    pages = max(1, -(-total // per_page))
    page = max(1, min(int(page), pages))
    offset = (page - 1) * per_page
    chunk = list(jobs.select_related("project").order_by("-created_at", "-id")[offset : offset + per_page])
    return {
        "jobs": _page_rows(chunk, providers=providers, live=live, now=now, with_attempts=with_attempts),
        "total": total,
        "total_capped": total_capped,
        "page": page,
        "pages": pages,
        "per_page": per_page,
        "has_next": page < pages,
        "has_previous": page > 1,
        "state": state,
    }


def jobs_after(*, user, state: str = "active", project_id=None, provider_id=None, after=None, limit: int = 50) -> dict:
    """One page of jobs newest first by key: `after` is the (created_at, id) of the last
    row of the previous page, so jobs created or deleted meanwhile never shift the page
    (no repeats, no skips). Its `next_after` is None on the last page."""
    now = timezone.now()
    providers, live = visible_providers(user), heartbeats.liveness(now=now)
    state = state if state in JOB_FILTER_STATES else "active"
    filters = {"project_id": project_id, "provider_id": provider_id, "model": "", "error": "", "search": ""}
    jobs = _filtered_jobs(user, state=state, **filters, providers=providers, live=live, now=now)
    total = jobs.count()
    if after is not None:
        moment, last_id = after
        jobs = jobs.filter(Q(created_at__lt=moment) | Q(created_at=moment, id__lt=last_id))
    chunk = list(jobs.select_related("project").order_by("-created_at", "-id")[: limit + 1])
    more, chunk = len(chunk) > limit, chunk[:limit]
    rows = _page_rows(chunk, providers=providers, live=live, now=now, with_attempts=False)
    return {"jobs": rows, "total": total, "next_after": (chunk[-1].created_at, chunk[-1].id) if more else None}


def _filtered_jobs(user, *, state, provider_id, project_id, model, error, search, providers, live, now):
    """The visible jobs in `state` that match every filter given (unordered)."""
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
        jobs = jobs.filter(search_condition(search))  # prompt, job id, task id
    return jobs


def _count(jobs, *, count_limit: int | None, known_total: int | None) -> tuple[int, bool]:
    """(how many jobs match, whether that number is cut at `count_limit`)."""
    if known_total is not None:
        # the caller already counted these (queue_status's totals): no second count
        return known_total, False
    if count_limit:
        # Counting every match of a broad filter costs more than the page itself; past
        # the limit the list says "10,000+" and pages through the first ones.
        total = jobs.order_by()[: count_limit + 1].count()
        return min(total, count_limit), total > count_limit
    return jobs.count(), False


def _page_rows(chunk: list, *, providers: dict, live: dict, now, with_attempts: bool) -> list[dict]:
    """The page's rows, with their attempt logs (one query) and their instances' health."""
    # One query for the page's attempts, in the order a job lists them. Not
    # prefetch_related: the attempts' default ordering ("job" first) joined every one to
    # its job to sort by the job's creation, and it built a queryset per job.
    attempts = defaultdict(list)
    if with_attempts and chunk:
        for attempt in JobAttempt.objects.filter(job_id__in=[job.id for job in chunk]).order_by("job_id", "number", "id"):
            attempts[attempt.job_id].append(attempt)
    health = runner_health({job.project_id for job in chunk if job.project.kind in runner_registry.RUNNERS}, now=now)
    return [
        job_row(job, providers=providers, live=live, now=now, attempts=attempts[job.id] if with_attempts else None, health=health)
        for job in chunk
    ]


def matching_job_ids(*, user, filters: dict, limit: int = BULK_LIMIT) -> list[str]:
    """The ids of every job the monitor's list matches with `filters` (the keyword
    arguments of jobs_page), newest first, at most `limit`: "all N matching" is exactly
    what the operator saw counted."""
    ids: list[str] = []
    page = 1
    while len(ids) < limit:
        chunk = jobs_page(user=user, page=page, per_page=BULK_PAGE, with_attempts=False, count_limit=limit, **filters)
        ids.extend(row["id"] for row in chunk["jobs"])
        if not chunk["has_next"] or chunk["page"] != page:
            break
        page += 1
    return ids[:limit]
