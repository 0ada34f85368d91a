"""Dispatch overhead, slot turnover and utilization, with real worker processes.

    python -m bench.throughput [--database-url URL] [--redis-url URL] [--jobs 400]

On its own database (SQLite under var/bench with the ORM broker, or PostgreSQL `rs_bench`
on the server of --database-url, with Redis when --redis-url is given), one qcluster of 4
workers and the queue service: bare django-q2 no-op tasks (median of three rounds); the
whole path on the instant demo provider, and its ratio to bare django-q2; 400 jobs of 200
ms at concurrency 4 against the ideal 20 s, and slot turnover (a call's end to the next
call's start in the freed slot), p50/p95.
"""

import argparse
import os
import sys
import time

from bench import runner
from bench.figures import emit, percentile

ROOT = runner.ROOT
BARE_ROUNDS = 3
OVERHEAD_GOAL = 0.135  # 3 × the 0.045 of issue 16's first run, as that issue set it
UTILIZATION_GOAL = 1.10


def noop(marker_path: str) -> None:
    """The bare task: append one byte, so the harness can count runs without a query."""
    fd = os.open(marker_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)


def turnover_gaps(calls: list[tuple[float, float]], concurrency: int) -> list[float]:
    """From each call's end to the start of the call that took its slot: walk the calls in
    start order; a start while all slots are busy cannot happen (the limit holds), so each
    start fills the slot freed longest ago."""
    free_since = [0.0] * concurrency  # a slot's release time; 0 = free from the start
    busy: list[float] = []  # end times of calls in flight
    gaps = []
    for start, end in sorted(calls):
        # release every call that ended before this start
        still = []
        for finish in busy:
            if finish <= start:
                free_since.append(finish)
            else:
                still.append(finish)
        busy = still
        free_since.sort()
        released = free_since.pop(0) if free_since else start
        if released > 0:
            gaps.append(start - released)
        busy.append(end)
    return gaps


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--database", default=runner.prefixed("rs_bench"))
    parser.add_argument("--cluster-name", default=runner.prefixed("rs_bench"))
    parser.add_argument("--tasks", type=int, default=1000, help="jobs (and bare tasks) for the overhead ratio")
    parser.add_argument("--jobs", type=int, default=400, help="200 ms jobs for utilization")
    parser.add_argument("--workers", type=int, default=4)
    return parser.parse_args(argv)


def bare_rate(args, var, stack: str) -> float:
    """Bare django-q2 no-op tasks a second: a second or so each on PostgreSQL + Redis, which
    moved by half from run to run; the median of BARE_ROUNDS is the ratio's base."""
    from django_q.tasks import async_task

    rates = []
    for round_number in range(BARE_ROUNDS):
        marker = var / f"noop-{round_number}.marks"
        started = time.monotonic()
        for _ in range(args.tasks):
            async_task("bench.throughput.noop", str(marker))
        runner.wait_for(
            lambda marker=marker: marker.exists() and marker.stat().st_size >= args.tasks,
            timeout=600,
            interval=0.02,
            message="no-op tasks",
        )
        rates.append(args.tasks / (time.monotonic() - started))
    rate = sorted(rates)[len(rates) // 2]
    spread = ", ".join(f"{one:.0f}" for one in rates)
    emit("bare_noop_tasks", f"{rate:.1f}", "tasks/s", f"{args.workers} workers; median of {spread}", stack=stack)
    return rate


def demo_jobs(user, name: str, *, concurrency: int, latency_ms: int, count: int):
    """`count` demo text jobs on a provider of their own, started at once and waited for:
    the provider and the seconds from the start to the last completed."""
    from queue_app.models import Job, Project, Provider, Status
    from queue_app.services.jobs import jobs_start

    provider = Provider.objects.create(
        owner=user, name=name, family="demo", concurrency=concurrency, options={"latency_ms": latency_ms}
    )
    project = Project.objects.create(owner=user, name=name, provider=provider, model="demo-text", kind="text")
    Job.objects.bulk_create([Job(project=project, owner=user, prompt=f"job {n}") for n in range(count)])
    started = time.monotonic()
    jobs_start(user=user, project=project, all_drafts=True)
    runner.wait_for(
        lambda: Job.objects.filter(project=project, status=Status.COMPLETED).count() >= count,
        timeout=900,
        interval=0.05,
        message=f"{name} jobs",
    )
    return provider, time.monotonic() - started


def whole_path(args, user, bare: float, stack: str) -> None:
    """The whole path on the instant demo provider, against bare django-q2."""
    _, seconds = demo_jobs(user, "instant", concurrency=args.workers, latency_ms=0, count=args.tasks)
    path_rate = args.tasks / seconds
    emit("whole_path_jobs", f"{path_rate:.1f}", "jobs/s", f"demo text, 0 ms, concurrency {args.workers}", stack=stack)
    ratio = path_rate / bare
    emit(
        "dispatch_overhead_ratio",
        f"{ratio:.3f}",
        "x",
        "whole-path jobs/s ÷ bare no-op tasks/s; 0.04–0.07 when issue 16 was filed",
        stack=stack,
        goal=f"≥ {OVERHEAD_GOAL}",
        met=ratio >= OVERHEAD_GOAL,
    )


def utilization(args, user, stack: str) -> None:
    """200 ms jobs at concurrency 4: wall time against the ideal, and slot turnover."""
    from queue_app.providers import demo

    provider, wall = demo_jobs(user, "200ms", concurrency=4, latency_ms=200, count=args.jobs)
    ideal = args.jobs * 0.2 / 4
    emit(
        "utilization_wall_time",
        f"{wall:.2f}",
        "s",
        f"ideal {ideal:.0f} s; {wall / ideal:.3f}x; 1.19–1.44x when issue 16 was filed",
        stack=stack,
        goal=f"≤ {UTILIZATION_GOAL:.2f}x ideal",
        met=wall / ideal <= UTILIZATION_GOAL,
    )
    calls = [(start, end) for start, end in demo.calls(provider.id) if end is not None]
    gaps = turnover_gaps(calls, 4)
    limit = 20 if args.redis_url else 100
    p95 = percentile(gaps, 95) * 1000
    emit("slot_turnover_p50", f"{percentile(gaps, 50) * 1000:.1f}", "ms", stack=stack)
    emit("slot_turnover_p95", f"{p95:.1f}", "ms", stack=stack, goal=f"p95 < {limit} ms", met=p95 < limit)
    emit("provider_peak_inflight", demo.peak_inflight(provider.id), "calls", "concurrency 4", stack=stack)


def main(argv=None) -> int:
    args = parse_args(argv)
    var = runner.fresh_dir(ROOT / "var" / "bench" / ("pg" if args.database_url else "sqlite"))
    stack_name = ("postgresql" if args.database_url else "sqlite") + "+" + ("redis" if args.redis_url else "orm")
    stack = runner.Stack(
        database_url=runner.database_url(args.database_url, args.database, var / "throughput.sqlite3"),
        redis_url=args.redis_url,
        cluster_name=args.cluster_name,
        var_dir=var,
        extra=dict(QUEUE_WORKERS=args.workers, LOG_LEVEL="WARNING"),
    )
    stack.prepare()
    import logging

    logging.getLogger("django-q").setLevel(logging.WARNING)
    from django.contrib.auth import get_user_model

    from queue_app.models import AccountSettings, Heartbeat

    user = get_user_model().objects.create_user(username="bench", password="bench-pw-unused")
    AccountSettings.objects.create(user=user, storage_limit_bytes=100 * 1024**3)
    logs = var / "logs"
    procs = [
        runner.manage(stack, "qcluster", "qcluster", log_dir=logs),
        runner.manage(stack, "queue", "queue_service", log_dir=logs),
    ]
    try:
        runner.wait_for(lambda: Heartbeat.objects.filter(role="worker").exists(), timeout=60, message="the worker cluster")
        time.sleep(1)
        bare = bare_rate(args, var, stack_name)
        whole_path(args, user, bare, stack_name)
        utilization(args, user, stack_name)
    finally:
        for proc in procs:
            proc.stop(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
