"""Dispatch overhead, slot turnover and utilization, with real worker processes.

    python -m bench.throughput [--database-url URL] [--redis-url URL] [--jobs 400]

In one run, on one broker and database (its own: SQLite `var/bench/throughput.sqlite3`
with the ORM broker, or PostgreSQL `rs_bench` on the server of --database-url, with
Redis when --redis-url is given), one qcluster of 4 workers and the queue service:

1. bare django-q2: N no-op tasks enqueued at once, timed until the last one ran (the
   median of three rounds);
2. the whole path: N drafts on the instant demo provider (sync, 0 ms, concurrency 4)
   started at once: claim → worker → provider → album item → completed → next, timed
   until the last completed; the ratio of the two rates;
3. 400 demo jobs of 200 ms at concurrency 4: wall time against the ideal 20 s, and
   slot turnover — from a call's end at the provider to the next call's start in the
   freed slot (the demo provider's own ledger), p50/p95.
"""

import argparse
import os
import sys
import time

from bench import runner

ROOT = runner.ROOT
LABEL = ""
BARE_ROUNDS = 3


def noop(marker_path: str) -> None:
    """The bare task: append one byte, so the harness can count runs without a query."""
    fd = os.open(marker_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)


def line(name, value, unit="", comparison=""):
    text = f"bench.{name}[{LABEL}] {value}"
    if unit:
        text += f" {unit}"
    if comparison:
        text += f" ({comparison})"
    print(text, flush=True)


def percentile(values, p):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


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


def main(argv=None) -> int:
    global LABEL
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--database", default="rs_bench")
    parser.add_argument("--cluster-name", default="rs_bench")
    parser.add_argument("--tasks", type=int, default=1000, help="jobs (and bare tasks) for the overhead ratio")
    parser.add_argument("--jobs", type=int, default=400, help="200 ms jobs for utilization")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    var = ROOT / "var" / "bench" / ("pg" if args.database_url else "sqlite")
    if args.database_url:
        url = runner.with_database(args.database_url, args.database)
    else:
        url = f"sqlite:///{var / 'throughput.sqlite3'}"
    LABEL = ("postgresql" if args.database_url else "sqlite") + "+" + ("redis" if args.redis_url else "orm")
    import shutil

    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    stack = runner.Stack(
        database_url=url,
        redis_url=args.redis_url,
        cluster_name=args.cluster_name,
        var_dir=var,
        extra=dict(QUEUE_WORKERS=args.workers, LOG_LEVEL="WARNING"),
    )
    stack.prepare()
    import logging

    logging.getLogger("django-q").setLevel(logging.WARNING)
    from django.contrib.auth import get_user_model
    from django_q.tasks import async_task

    from queue_app.models import AccountSettings, Job, Project, Provider, Status
    from queue_app.providers import demo
    from queue_app.services.jobs import jobs_start

    user = get_user_model().objects.create_user(username="bench", password="bench-pw-unused")
    AccountSettings.objects.create(user=user, storage_limit_bytes=100 * 1024**3)
    logs = var / "logs"
    procs = [
        runner.manage(stack, "qcluster", "qcluster", log_dir=logs),
        runner.manage(stack, "queue", "queue_service", log_dir=logs),
    ]
    try:
        from queue_app.models import Heartbeat

        runner.wait_for(lambda: Heartbeat.objects.filter(role="worker").exists(), timeout=60, message="the worker cluster")
        time.sleep(1)

        # 1. bare django-q2 no-op tasks: a second or so each on PostgreSQL + Redis, which
        # moved by half from run to run; the median of BARE_ROUNDS is the ratio's base.
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
        bare_rate = sorted(rates)[len(rates) // 2]
        spread = ", ".join(f"{rate:.0f}" for rate in rates)
        line("bare_noop_tasks", f"{bare_rate:.1f}", "tasks/s", f"{args.workers} workers; median of {spread}")

        # 2. the whole path on the instant demo provider
        provider = Provider.objects.create(
            owner=user, name="instant", family="demo", concurrency=args.workers, options={"latency_ms": 0}
        )
        project = Project.objects.create(owner=user, name="instant", provider=provider, model="demo-text", kind="text")
        Job.objects.bulk_create([Job(project=project, owner=user, prompt=f"job {n}") for n in range(args.tasks)])
        started = time.monotonic()
        jobs_start(user=user, project=project, all_drafts=True)
        runner.wait_for(
            lambda: Job.objects.filter(project=project, status=Status.COMPLETED).count() >= args.tasks,
            timeout=900,
            interval=0.05,
            message="instant jobs",
        )
        path_rate = args.tasks / (time.monotonic() - started)
        line("whole_path_jobs", f"{path_rate:.1f}", "jobs/s", f"demo text, 0 ms, concurrency {args.workers}")
        filed = "0.04–0.07 when issue 16 was filed, goal 3× that"
        line("dispatch_overhead_ratio", f"{path_rate / bare_rate:.3f}", "x", f"whole-path jobs/s ÷ bare no-op tasks/s; {filed}")

        # 3. utilization and slot turnover: 200 ms jobs at concurrency 4
        provider = Provider.objects.create(owner=user, name="200ms", family="demo", concurrency=4, options={"latency_ms": 200})
        project = Project.objects.create(owner=user, name="200ms", provider=provider, model="demo-text", kind="text")
        Job.objects.bulk_create([Job(project=project, owner=user, prompt=f"job {n}") for n in range(args.jobs)])
        started = time.monotonic()
        jobs_start(user=user, project=project, all_drafts=True)
        runner.wait_for(
            lambda: Job.objects.filter(project=project, status=Status.COMPLETED).count() >= args.jobs,
            timeout=900,
            interval=0.05,
            message="200 ms jobs",
        )
        wall = time.monotonic() - started
        ideal = args.jobs * 0.2 / 4
        filed = "1.19–1.44x when issue 16 was filed"
        line("utilization_wall_time", f"{wall:.2f}", "s", f"ideal {ideal:.0f} s; {wall / ideal:.3f}x, goal ≤ 1.10x; {filed}")
        calls = [(start, end) for start, end in demo.calls(provider.id) if end is not None]
        gaps = turnover_gaps(calls, 4)
        goal = "goal p95 < 20 ms" if args.redis_url else "goal p95 < 100 ms"
        line("slot_turnover_p50", f"{percentile(gaps, 50) * 1000:.1f}", "ms")
        line("slot_turnover_p95", f"{percentile(gaps, 95) * 1000:.1f}", "ms", goal)
        line("provider_peak_inflight", demo.peak_inflight(provider.id), "calls", "concurrency 4")
    finally:
        for proc in procs:
            proc.stop(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
