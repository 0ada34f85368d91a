"""The recovery scan at scale, and one detached poll cycle at scale.

    python -m bench.recovery_scan [--database-url URL] [--pending 100000] [--processing 10000]
                                  [--detached 5000 (0: no poll cycle)] [--poll-latency-ms 100] [--single-detached 500]

Recovery: `--pending` pending jobs and `--processing` running jobs whose worker is gone;
`recovery.recover()` timed with the resident memory growth, then the same work again under
tracemalloc for its peak Python allocation; the per-job figures from before the set-based
batches beside. Then one detached poll cycle (bench/poll_cycle.py) of `--detached` tasks
through Replicate's list of predictions, and `--single-detached` tasks one request each.
`--pending 0 --processing 0` skips the recovery part.
"""

import argparse
import sys
import time
import tracemalloc
import uuid
from datetime import timedelta

from bench import poll_cycle, runner
from bench.figures import emit

ROOT = runner.ROOT
SCAN_GOAL_SECONDS = 10  # at 100,000 pending + 10,000 processing

# The figures of the per-job recovery (before issue 16's set-based batches).
BEFORE_SECONDS = 247
BEFORE_PEAK_MB = 22


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--database", default=runner.prefixed("rs_bench_scan"))
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--processing", type=int, default=10_000)
    parser.add_argument("--detached", type=int, default=5_000)
    parser.add_argument("--poll-latency-ms", type=float, default=100)
    parser.add_argument("--poll-parallelism", type=int, default=None)
    parser.add_argument("--single-detached", type=int, default=500, help="tasks checked one request each (0: skip)")
    return parser.parse_args(argv)


def restall(gone) -> None:
    """Every processing job's worker is gone again, its attempt open: a second scan has
    the same work as the first."""
    from queue_app.models import Job, JobAttempt, Status

    processing = Job.objects.filter(status=Status.PROCESSING)
    JobAttempt.objects.bulk_create(
        [JobAttempt(job_id=job_id, number=2) for job_id in processing.values_list("id", flat=True)], batch_size=5000
    )
    processing.update(lease_owner="elsewhere:1", lease_expires_at=gone, attempts=1)


def seed(user, args, now, gone) -> None:
    """`--processing` running jobs whose worker is gone (expired leases, spread over 100
    providers' slots) with their open attempts, and `--pending` pending jobs."""
    from django.db import connection

    from queue_app.models import Job, JobAttempt, Project, Provider, Status

    providers = Provider.objects.bulk_create(
        [Provider(owner=user, name=f"p{n}", family="demo", concurrency=100, options={"latency_ms": 0}) for n in range(100)]
    )
    projects = Project.objects.bulk_create(
        [
            Project(owner=user, name=f"p{n}", provider=provider, model="demo-text", kind="text")
            for n, provider in enumerate(providers)
        ]
    )
    stalled = dict(status=Status.PROCESSING, lease_owner="elsewhere:1", lease_expires_at=gone, attempts=1)
    stalled.update(queued_at=gone, started_at=gone, resolved={"kind": "text", "model": "demo-text"})
    batch = [
        Job(
            project=projects[n % len(projects)],
            owner=user,
            prompt="p",
            active_provider_id=projects[n % len(projects)].provider_id,
            slot=n // len(projects),
            lease_token=uuid.uuid4(),
            **stalled,
        )
        for n in range(args.processing)
    ]
    Job.objects.bulk_create(batch, batch_size=2000)
    for start in range(0, args.pending, 5000):
        Job.objects.bulk_create(
            [
                Job(project=projects[n % len(projects)], owner=user, prompt="p", status=Status.PENDING, queued_at=now)
                for n in range(start, min(args.pending, start + 5000))
            ],
            batch_size=5000,
        )
    JobAttempt.objects.bulk_create(
        [
            JobAttempt(job_id=job_id, number=1)
            for job_id in Job.objects.filter(status=Status.PROCESSING).values_list("id", flat=True)
        ],
        batch_size=5000,
    )
    if connection.vendor == "postgresql":
        # What autovacuum does for a table that grew to this size: without statistics the
        # planner takes the 110,000 rows bulk-inserted a moment ago for an empty table.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    connection.close()


def measure_recovery(args, gone, stack: str) -> None:
    """`recovery.recover()` timed with the resident memory growth, then the same work again
    under tracemalloc for its peak Python allocation."""
    import psutil

    from queue_app.queue_service import recovery

    rss_before = psutil.Process().memory_info().rss
    started = time.monotonic()
    counts = recovery.recover()
    elapsed = time.monotonic() - started
    rss_growth = psutil.Process().memory_info().rss - rss_before
    emit(
        "recovery_scan_time",
        f"{elapsed:.2f}",
        "s",
        f"{args.pending} pending + {args.processing} processing; healed {counts['healed']}, claimed {counts['dispatched']}; "
        f"before, per job: {BEFORE_SECONDS} s on PostgreSQL at 100,000 + 10,000",
        stack=stack,
        goal=f"< {SCAN_GOAL_SECONDS} s",
        met=elapsed < SCAN_GOAL_SECONDS,
    )
    emit("recovery_scan_rss_growth", f"{rss_growth / 1e6:.1f}", "MB", stack=stack)
    # The same work again under tracemalloc (which slows allocation-heavy Python several
    # times, so it is not in the timed pass): the claimed jobs' workers are gone again.
    restall(gone)
    tracemalloc.start()
    started = time.monotonic()
    again = recovery.recover()
    traced = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    emit(
        "recovery_scan_peak_python_alloc",
        f"{peak / 1e6:.1f}",
        "MB",
        f"tracemalloc peak; healed {again['healed']}, claimed {again['dispatched']} in {traced:.1f} s traced; "
        f"before, per job: {BEFORE_PEAK_MB} MB",
        stack=stack,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    var = runner.fresh_dir(ROOT / "var" / "bench" / ("scan-pg" if args.database_url else "scan-sqlite"))
    stack_name = "postgresql" if args.database_url else "sqlite"
    from tests.fakes.chaos_provider import ChaosProvider

    fake = ChaosProvider(seed=1).start()
    stack = runner.Stack(
        database_url=runner.database_url(args.database_url, args.database, var / "scan.sqlite3"),
        cluster_name=runner.prefixed("rs_bench_scan"),
        var_dir=var,
        extra=dict(LOG_LEVEL="WARNING", OUTBOUND_ALLOWLIST=f"127.0.0.1:{fake.port}", OUTBOUND_ALLOW_HTTP="True"),
    )
    stack.prepare()
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from queue_app.engine import enqueue
    from queue_app.models import AccountSettings, Job

    enqueue.enqueue_task = lambda func, *args: None  # no broker: nothing runs the claims here
    user = get_user_model().objects.create_user(username="bench", password="bench-pw-unused")
    AccountSettings.objects.create(user=user)
    now = timezone.now()
    gone = now - timedelta(minutes=5)
    seed(user, args, now, gone)
    measure_recovery(args, gone, stack_name)
    Job.objects.all().delete()
    if args.detached > 0:
        cycles = poll_cycle.Cycles(
            fake=fake, user=user, latency_ms=args.poll_latency_ms, parallelism=args.poll_parallelism, now=now
        )
        poll_cycle.report(cycles, detached=args.detached, single_detached=args.single_detached, stack=stack_name)
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
