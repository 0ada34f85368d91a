"""Who is alive and what each one runs: the workers page's reads.

From the database alone, at a constant number of queries:
- live processes: heartbeat rows seen within three heartbeat periods (engine/heartbeats);
- what runs now: attempts still "running" on processing jobs. An attempt names its
  process `host:pid` (the qcluster worker process that took the lease); the cluster it
  belongs to is the live cluster on that host (the heartbeat is the cluster's main
  process, a different pid), named only when the host has one;
- recently dead processes (a heartbeat that stopped within DEAD_WINDOW) with what they
  held: attempts on their host that were still open while they lived and that the recovery
  scan ended ("interrupted", "lost") or that are still "running", each with what became of
  its job since (its status now). A host with several clusters cannot tell which one held
  what; the page says "on this host".
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

    held: dict = defaultdict(list)
    if dead:
        earliest = min(hb.started_at for hb in dead)
        on_hosts = Q()
        for host in {hb.host for hb in dead}:
            on_hosts |= Q(worker__startswith=f"{host}:")
        attempts = (
            _attempts(user)
            .filter(on_hosts, started_at__gte=earliest, outcome__in=(Outcome.RUNNING, Outcome.INTERRUPTED, Outcome.LOST))
            .order_by("-started_at")[:RUNNING_ROWS]
        )
        for attempt in attempts:
            for hb in dead:
                ended = attempt.finished_at or now
                if (
                    _host(attempt.worker) == hb.host
                    and hb.started_at <= attempt.started_at <= hb.seen_at + window
                    and ended >= hb.seen_at - window
                ):
                    held[hb.id].append(_attempt_row(attempt, now))
                    break

    def process(hb, **extra):
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

    return {
        "now": now,
        "live": [process(hb, running=placed.get(hb.id, [])) for hb in live],
        "unplaced": unplaced,
        "dead": [process(hb, held=held.get(hb.id, [])) for hb in dead],
        "counts": {role: sum(1 for hb in live if hb.role == role) for role in Heartbeat.Role.values},
    }
