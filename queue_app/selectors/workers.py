"""Who is alive and what each one runs: the workers page's reads, from the database alone
at a constant number of queries.

Live processes are fresh heartbeats. What runs now is the open attempts of processing
jobs; an attempt names its process `host:pid`, so it is placed under the host's one live
worker cluster (or "on this host" when there are several). Recently dead processes show
the attempts on their host that were open while they lived, and what became of each job.
"""

from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from queue_app.models import Heartbeat, JobAttempt, Status

Outcome = JobAttempt.Outcome
DEAD_WINDOW = timedelta(hours=24)
DEAD_ROWS = 20
RUNNING_ROWS = 200


def _attempts(user):
    attempts = JobAttempt.objects.select_related("job", "job__project")
    return attempts if user.is_staff else attempts.filter(job__owner=user)


def _host(worker: str) -> str:
    return worker.rpartition(":")[0]


def _attempt_row(attempt: JobAttempt, now) -> dict:
    job = attempt.job
    host, _, pid = attempt.worker.rpartition(":")
    return {
        "job_id": str(job.id),
        "short_id": str(job.id)[:8],
        "project_id": job.project_id,
        "project_name": job.project.name,
        "prompt": job.prompt[:120],
        "task_id": job.task_id,
        "attempt": attempt.number,
        "worker": attempt.worker,
        "host": host,
        "pid": pid,
        "started_at": attempt.started_at,
        "running_seconds": (now - attempt.started_at).total_seconds(),
        "outcome": attempt.outcome,
        "finished_at": attempt.finished_at,
        "job_status": job.status,
        "job_error": job.error[:200],
    }


def workers_overview(*, user, now=None) -> dict:
    """{"live": [process rows, each with "running": [attempt rows]], "unplaced": [attempt
    rows on hosts without one live cluster], "dead": [process rows with "held"]}. Four
    queries."""
    now = now or timezone.now()
    window = timedelta(seconds=settings.HEARTBEAT_SECONDS * 3)
    beats = list(Heartbeat.objects.filter(seen_at__gte=now - DEAD_WINDOW).order_by("role", "host", "pid"))
    live = [hb for hb in beats if hb.seen_at >= now - window]
    dead = sorted((hb for hb in beats if hb.seen_at < now - window), key=lambda hb: hb.seen_at, reverse=True)[:DEAD_ROWS]
    placed, unplaced = _running_by_cluster(user, live, now)
    held = _held_by_dead(user, dead, now, window)
    return {
        "now": now,
        "live": [_process_row(hb, now, running=placed.get(hb.id, [])) for hb in live],
        "unplaced": unplaced,
        "dead": [_process_row(hb, now, held=held.get(hb.id, [])) for hb in dead],
        "counts": {role: sum(1 for hb in live if hb.role == role) for role in Heartbeat.Role.values},
    }


def _running_by_cluster(user, live: list, now) -> tuple[dict, list]:
    """({live cluster's heartbeat id: attempt rows}, rows on hosts with no or several live
    clusters): what each live worker cluster runs now."""
    clusters_by_host = defaultdict(list)
    for hb in live:
        if hb.role == Heartbeat.Role.WORKER:
            clusters_by_host[hb.host].append(hb)
    running = _attempts(user).filter(outcome=Outcome.RUNNING, job__status=Status.PROCESSING).order_by("started_at")
    placed: dict = defaultdict(list)
    unplaced = []
    for attempt in running[:RUNNING_ROWS]:
        row = _attempt_row(attempt, now)
        clusters = clusters_by_host.get(row["host"], [])
        if len(clusters) == 1:
            placed[clusters[0].id].append(row)
        else:
            unplaced.append(row)
    return placed, unplaced


def _held_by_dead(user, dead: list, now, window: timedelta) -> dict:
    """{dead process's heartbeat id: attempt rows} of the attempts on its host that were
    open while it lived (one query for every dead process)."""
    held: dict = defaultdict(list)
    if not dead:
        return held
    on_hosts = Q()
    for host in {hb.host for hb in dead}:
        on_hosts |= Q(worker__startswith=f"{host}:")
    attempts = (
        _attempts(user)
        .filter(
            on_hosts,
            started_at__gte=min(hb.started_at for hb in dead),
            outcome__in=(Outcome.RUNNING, Outcome.INTERRUPTED, Outcome.LOST),
        )
        .order_by("-started_at")[:RUNNING_ROWS]
    )
    for attempt in attempts:
        ended = attempt.finished_at or now
        for hb in dead:
            if (
                _host(attempt.worker) == hb.host
                and hb.started_at <= attempt.started_at <= hb.seen_at + window
                and ended >= hb.seen_at - window
            ):
                held[hb.id].append(_attempt_row(attempt, now))
                break
    return held


def _process_row(hb: Heartbeat, now, **extra) -> dict:
    return {
        "name": hb.name,
        "role": hb.role,
        "host": hb.host,
        "pid": hb.pid,
        "started_at": hb.started_at,
        "seen_at": hb.seen_at,
        "seen_seconds_ago": (now - hb.seen_at).total_seconds(),
        "up_seconds": (hb.seen_at - hb.started_at).total_seconds(),
        **extra,
    }
