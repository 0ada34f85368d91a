"""Helpers the tests share for driving the engine and the queue service by hand. Product
modules keep no code only tests call: what a test needs beyond the product's own calls
lives here."""

from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db.models import Q
from django.db.models.functions import Now

from queue_app.engine import events, hot_sql, runner_registry
from queue_app.models import Job, Status
from queue_app.queue_service import poll_pool, poller


def poll_once(*, now=None, families=None, parallelism: int | None = None) -> int:
    """One blocking poll cycle: claim what is due, check it all, return how many were
    checked (the queue service steps a Poller instead)."""
    claimed = poller.claim_due(now=now, families=families)
    if not claimed:
        return 0
    workers = max(1, min(parallelism or settings.POLL_PARALLELISM, len(claimed)))
    if workers == 1:
        for job_id, token, _ in claimed:
            poller.check_job(job_id, token, now=now)
        return len(claimed)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="poll") as pool:
        list(pool.map(lambda item: poll_pool._check_in_thread(item[0], item[1], now=now, keep_connection=False), claimed))
    return len(claimed)


def inflight(pool: poll_pool.Poller) -> int:
    """The checks a Poller has running now."""
    with pool._lock:
        return sum(pool._inflight.values())


def dispatchable_jobs(provider_id: int):
    """What a claim reads (hot_sql.dispatchable_with_projects), as the ORM would read it:
    the pending jobs this provider would run now, oldest started first (before fair share
    orders them: `fair_order`)."""
    projects = hot_sql.project_ids(provider_id)
    return (
        Job.objects.filter(status=Status.PENDING)
        .filter(Q(provider_id=provider_id) | Q(provider__isnull=True, project_id__in=projects))
        .exclude(project__kind__in=runner_registry.kinds())
        .filter(Q(not_before__isnull=True) | Q(not_before__lte=Now()))
        .order_by("queued_at", "created_at", "id")
    )


def fair_order(provider_id: int) -> list:
    """dispatchable_jobs in fair-share order, worked out in Python (engine/fair_share.py's
    rule): (slots the project holds + jobs ahead in its queue) / its weight, then the
    project longest unserved on this provider, then the oldest."""
    from collections import Counter

    from queue_app.models import ShareTurn

    jobs = list(dispatchable_jobs(provider_id).select_related("project"))
    busy = Counter(
        Job.objects.filter(active_provider_id=provider_id, status=Status.PROCESSING).values_list("project_id", flat=True)
    )
    turns = dict(ShareTurn.objects.filter(provider_id=provider_id).values_list("project_id", "served_at"))
    # Jobs moved to the front ("run next") come first, and first within their project.
    jobs.sort(key=lambda job: (job.run_next_at is None, job.run_next_at or 0))
    ahead, keyed = Counter(), []
    for job in jobs:
        served = turns.get(job.project_id)
        share = (busy[job.project_id] + ahead[job.project_id]) / job.project.share_weight
        pushed = (job.run_next_at is None, job.run_next_at or 0)
        keyed.append(((*pushed, share, served is not None, served or 0, job.queued_at, job.created_at, job.id), job))
        ahead[job.project_id] += 1
    return [job for _, job in sorted(keyed, key=lambda pair: pair[0])]


def flush_broadcasts(timeout: float = 5.0) -> bool:
    """Wait until the process's sender thread has sent every event handed to it."""
    return events._sender.flush(timeout)


def stop_listeners(listeners) -> None:
    """Close every ComfyUI socket of a comfy_app.ws.Listeners and stop its loop."""
    for instance_id in list(listeners._tasks):
        listeners.drop(instance_id)
    listeners._loop.call_soon_threadsafe(listeners._loop.stop)


def usage_and_limit(user_id: int, *, excluding_job=None) -> tuple[int, int]:
    """The output writer's quota read (hot_sql.job_to_complete names the user and the job
    left out by its own columns), here with parameters: (bytes stored, limit)."""
    from queue_app.engine import model_sql

    if excluding_job is None:
        sql, params = hot_sql._usage_and_limit_sql("%s", None), [user_id, user_id, user_id]
    else:
        job = hot_sql._param(Job, "id", excluding_job)
        sql, params = hot_sql._usage_and_limit_sql("%s", "%s"), [user_id, job, user_id, user_id]
    [(used, limit)] = model_sql.fetch(f"SELECT {sql}", params)
    return hot_sql._usage_and_limit(used, limit)
