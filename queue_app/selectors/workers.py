"""Who is alive and what each one runs: the workers page's reads, from the database alone
at a constant number of queries.

Live processes are fresh heartbeats not found dead. What runs now is the open attempts of
processing jobs; an attempt names its worker process `host:pid`, and a cluster's heartbeat
lists its processes (`children`), so the attempt is placed under its own cluster however
many share the host (a cluster that never listed them: the host's one live cluster).
Recently dead processes — stopped beating, or found dead by the heal, which leaves a
tombstone (`released_at`) — show the attempts they held and what became of each job.
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
    rows no live cluster can be named for], "dead": [process rows with "held"]}. Four
    queries."""
    now = now or timezone.now()
    window = timedelta(seconds=settings.HEARTBEAT_SECONDS * 3)
    beats = list(Heartbeat.objects.filter(seen_at__gte=now - DEAD_WINDOW).order_by("role", "host", "pid"))
    live = [hb for hb in beats if hb.seen_at >= now - window and hb.released_at is None]
    gone = [hb for hb in beats if hb not in live]
    dead = sorted(gone, key=lambda hb: hb.released_at or hb.seen_at, reverse=True)[:DEAD_ROWS]
    placed, unplaced = _running_by_cluster(user, live, now)
    held = _held_by_dead(user, dead, now, window)
    return {
        "now": now,
        "live": [_process_row(hb, now, running=placed.get(hb.id, [])) for hb in live],
        "unplaced": unplaced,
        "dead": [_process_row(hb, now, held=held.get(hb.id, [])) for hb in dead],
        "counts": {role: sum(1 for hb in live if hb.role == role) for role in Heartbeat.Role.values},
    }


def _names(hb: Heartbeat) -> list[str]:
    """The `host:pid` names a process's attempts carry: its own and its cluster's children."""
    return [f"{hb.host}:{pid}" for pid in [hb.pid, *(hb.children or [])]]


def _running_by_cluster(user, live: list, now) -> tuple[dict, list]:
    """({live cluster's heartbeat id: attempt rows}, rows no cluster can be named for):
    what each live worker cluster runs now."""
    clusters = [hb for hb in live if hb.role == Heartbeat.Role.WORKER]
    by_name = {name: hb for hb in clusters for name in _names(hb)}
    clusters_by_host = defaultdict(list)
    for hb in clusters:
        clusters_by_host[hb.host].append(hb)
    running = _attempts(user).filter(outcome=Outcome.RUNNING, job__status=Status.PROCESSING).order_by("started_at")
    placed: dict = defaultdict(list)
    unplaced = []
    for attempt in running[:RUNNING_ROWS]:
        row = _attempt_row(attempt, now)
        cluster = by_name.get(attempt.worker)
        on_host = clusters_by_host.get(row["host"], [])
        if cluster is None and len(on_host) == 1 and not on_host[0].children:
            cluster = on_host[0]  # a cluster that lists no processes (no /proc): the host's one
        if cluster is not None:
            placed[cluster.id].append(row)
        else:
            unplaced.append(row)
    return placed, unplaced


def _held_by_dead(user, dead: list, now, window: timedelta) -> dict:
    """{dead process's heartbeat id: attempt rows} of the attempts it (or, when it listed
    no processes, its host) ran while it lived (one query for every dead process)."""
    held: dict = defaultdict(list)
    if not dead:
        return held
    names = {name: hb for hb in dead if hb.children for name in _names(hb)}
    on_hosts = Q(worker__in=list(names))
    for host in {hb.host for hb in dead if not hb.children}:
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
        owners = [names[attempt.worker]] if attempt.worker in names else [hb for hb in dead if not hb.children]
        for hb in owners:
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
        "released_at": hb.released_at,
        "released_seconds_ago": (now - hb.released_at).total_seconds() if hb.released_at else None,
        **extra,
    }
