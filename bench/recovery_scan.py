"""The recovery scan at scale, and one detached poll cycle at scale.

    python -m bench.recovery_scan [--database-url URL] [--pending 100000] [--processing 10000]
                                  [--detached 5000 (0: no poll cycle)] [--poll-latency-ms 100] [--single-detached 500]

Recovery: a database with `--pending` pending jobs and `--processing` running jobs
whose worker is gone (expired leases, spread over 100 providers' slots), no workers
running; `recovery.recover()` timed, with the process's resident memory growth, then the
same work again (the claimed jobs' workers gone too) under tracemalloc for its peak Python
allocation. The per-job figures from before the set-based batches are printed beside.

Detached polling: `--detached` jobs detached on a fake Replicate server that answers
each status request (a single check or a list page) after `--poll-latency-ms` (all still
processing); the queue service's Poller steps once a second until every task was checked
once (one 30 s cycle's worth of work), timed, with the status requests and SQL queries it
took. First through Replicate's list of predictions (100 tasks a request, the default),
then `--single-detached` tasks one request each (the list left unused: the old figure's
setting), both within the record's status budget (3,000 a minute). `--pending 0
--processing 0` skips the recovery part.
"""

import argparse
import sys
import threading
import time
import tracemalloc
import uuid
from datetime import timedelta

from bench import runner

ROOT = runner.ROOT
LABEL = ""


# The figures of the per-job recovery (README, before issue 16's set-based batches).
BEFORE_SECONDS = 247
BEFORE_PEAK_MB = 22


def restall(gone) -> None:
    """Every processing job's worker is gone again, its attempt open: a second scan has
    the same work as the first."""
    from queue_app.models import Job, JobAttempt, Status

    processing = Job.objects.filter(status=Status.PROCESSING)
    JobAttempt.objects.bulk_create(
        [JobAttempt(job_id=job_id, number=2) for job_id in processing.values_list("id", flat=True)], batch_size=5000
    )
    processing.update(lease_owner="elsewhere:1", lease_expires_at=gone, attempts=1)


def line(name, value, unit="", comparison=""):
    text = f"bench.{name}[{LABEL}] {value}"
    if unit:
        text += f" {unit}"
    if comparison:
        text += f" ({comparison})"
    print(text, flush=True)


class QueryCounter:
    """Counts SQL statements from every thread (Django's capture is per connection)."""

    def __init__(self):
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, execute, sql, params, many, context):
        with self.lock:
            self.count += 1
        return execute(sql, params, many, context)


def main(argv=None) -> int:
    global LABEL
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--database", default="rs_bench_scan")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--processing", type=int, default=10_000)
    parser.add_argument("--detached", type=int, default=5_000)
    parser.add_argument("--poll-latency-ms", type=float, default=100)
    parser.add_argument("--poll-parallelism", type=int, default=None)
    parser.add_argument("--single-detached", type=int, default=500, help="tasks checked one request each (0: skip)")
    args = parser.parse_args(argv)
    var = ROOT / "var" / "bench" / ("scan-pg" if args.database_url else "scan-sqlite")
    url = runner.with_database(args.database_url, args.database) if args.database_url else f"sqlite:///{var / 'scan.sqlite3'}"
    LABEL = "postgresql" if args.database_url else "sqlite"
    import shutil

    from tests.fakes.chaos_provider import ChaosProvider

    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    fake = ChaosProvider(seed=1).start()
    stack = runner.Stack(
        database_url=url,
        cluster_name="rs_bench_scan",
        var_dir=var,
        extra=dict(LOG_LEVEL="WARNING", OUTBOUND_ALLOWLIST=f"127.0.0.1:{fake.port}", OUTBOUND_ALLOW_HTTP="True"),
    )
    stack.prepare()
    import psutil
    from django.contrib.auth import get_user_model
    from django.db import connection, connections
    from django.utils import timezone

    from queue_app.engine import enqueue
    from queue_app.models import AccountSettings, Job, JobAttempt, Project, Provider, Status
    from queue_app.queue_service import poller, recovery

    enqueue.enqueue_task = lambda func, *args: None  # no broker: nothing runs the claims here
    user = get_user_model().objects.create_user(username="bench", password="bench-pw-unused")
    AccountSettings.objects.create(user=user)

    # --- recovery scan -------------------------------------------------------------
    providers = Provider.objects.bulk_create(
        [Provider(owner=user, name=f"p{n}", family="demo", concurrency=100, options={"latency_ms": 0}) for n in range(100)]
    )
    projects = Project.objects.bulk_create(
        [
            Project(owner=user, name=f"p{n}", provider=provider, model="demo-text", kind="text")
            for n, provider in enumerate(providers)
        ]
    )
    now = timezone.now()
    gone = now - timedelta(minutes=5)
    batch = []
    for n in range(args.processing):
        project = projects[n % len(projects)]
        batch.append(
            Job(
                project=project,
                owner=user,
                prompt="p",
                status=Status.PROCESSING,
                active_provider_id=project.provider_id,
                slot=n // len(projects),
                lease_owner="elsewhere:1",
                lease_token=uuid.uuid4(),
                lease_expires_at=gone,
                attempts=1,
                queued_at=gone,
                started_at=gone,
                resolved={"kind": "text", "model": "demo-text"},
            )
        )
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
    rss_before = psutil.Process().memory_info().rss
    started = time.monotonic()
    counts = recovery.recover()
    elapsed = time.monotonic() - started
    rss_growth = psutil.Process().memory_info().rss - rss_before
    line(
        "recovery_scan_time",
        f"{elapsed:.2f}",
        "s",
        f"{args.pending} pending + {args.processing} processing; healed {counts['healed']}, claimed {counts['dispatched']}; "
        f"before, per job: {BEFORE_SECONDS} s on PostgreSQL at 100,000 + 10,000",
    )
    line("recovery_scan_rss_growth", f"{rss_growth / 1e6:.1f}", "MB")
    # The same work again under tracemalloc (which slows allocation-heavy Python several
    # times, so it is not in the timed pass): the claimed jobs' workers are gone again.
    restall(gone)
    tracemalloc.start()
    started = time.monotonic()
    again = recovery.recover()
    traced = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    line(
        "recovery_scan_peak_python_alloc",
        f"{peak / 1e6:.1f}",
        "MB",
        f"tracemalloc peak; healed {again['healed']}, claimed {again['dispatched']} in {traced:.1f} s traced; "
        f"before, per job: {BEFORE_PEAK_MB} MB",
    )
    Job.objects.all().delete()
    if args.detached <= 0:
        fake.stop()
        return 0

    # --- one detached poll cycle ---------------------------------------------------
    from tests.fakes.chaos_provider import Prediction

    counter = QueryCounter()
    from django.db.backends.signals import connection_created

    def instrument(sender, connection, **kwargs):
        # Once per connection object: a thread that reconnects fires this again.
        if counter not in connection.execute_wrappers:
            connection.execute_wrappers.append(counter)

    connection_created.connect(instrument)

    def cycle(name: str, count: int) -> dict:
        """`count` detached tasks, all still processing, on records of at most 1,000 slots
        (the concurrency limit's bound), each with its own key; the queue service's Poller
        stepped once a second until every task was checked once."""
        from queue_app.limits import CONCURRENCY

        records = []
        for start in range(0, count, CONCURRENCY.high):
            size = min(CONCURRENCY.high, count - start)
            key = f"r8_bench_{name}_" + uuid.uuid4().hex
            fake.configure(key, family="replicate", latency=(1e9, 1e9)).poll_delay = args.poll_latency_ms / 1000
            provider = Provider(
                owner=user,
                name=f"{name}-{start // CONCURRENCY.high}",
                family="replicate",
                base_url=f"{fake.url}/v1",
                concurrency=size,
                max_attempts=4,
            )
            provider.api_key = key
            provider.save()
            records.append((key, provider, size))
        batch = []
        for key, provider, size in records:
            project = Project.objects.create(
                owner=user, name=provider.name, provider=provider, model="black-forest-labs/flux-schnell"
            )
            created = time.time()
            for n in range(size):
                prediction_id = uuid.uuid4().hex[:26]
                fake.predictions[prediction_id] = Prediction(
                    id=prediction_id,
                    key=key,
                    job=str(n),
                    created=created + n * 1e-6,
                    work_end=float("inf"),
                    failed=False,
                    input={},
                    model="m",
                )
                batch.append(
                    Job(
                        project=project,
                        owner=user,
                        prompt="p",
                        status=Status.PROCESSING,
                        active_provider=provider,
                        slot=n,
                        lease_token=uuid.uuid4(),
                        task_id=prediction_id,
                        task_observed_at=timezone.now(),
                        next_poll_at=timezone.now() - timedelta(seconds=1),
                        attempts=1,
                        started_at=now,
                        resolved={"kind": "image", "model": "black-forest-labs/flux-schnell", "family": "replicate"},
                    )
                )
        Job.objects.bulk_create(batch, batch_size=2000)
        for conn in connections.all():
            conn.close()
        keys = {key for key, _, _ in records}

        def polled() -> int:
            with fake.lock:
                return sum(1 for p in fake.predictions.values() if p.key in keys and (p.polls or p.listed))

        counter.count = 0
        # As the queue service runs it: a step a second; the threads refill themselves between.
        pool = poller.Poller(parallelism=args.poll_parallelism)
        started = time.monotonic()
        last_step = 0.0
        while polled() < count:
            if time.monotonic() - last_step >= 1.0:
                pool.step()
                last_step = time.monotonic()
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        pool.wait()
        pool.close()
        queries = counter.count
        from queue_app.selectors.queue import queue_status
        from queue_app.web.metrics import EVERYONE

        status = queue_status(user=EVERYONE, breakdown="providers")
        ids = {provider.id for _, provider, _ in records}
        behind = [row["polling_message"] for row in status["providers"] if row["id"] in ids and row["polling_message"]]
        Job.objects.filter(active_provider_id__in=ids).delete()
        return dict(
            elapsed=elapsed,
            queries=queries,
            singles=sum(len(fake.entries(key, "poll")) for key in keys),
            pages=sum(len(fake.entries(key, "list")) for key in keys),
            per_provider=pool.per_provider,
            records=len(records),
            behind=behind,
        )

    # The list endpoint: a page of 100 a request, within Replicate's 3,000 a minute.
    batched = cycle("replicate-list", args.detached)
    requests_made = batched["pages"] + batched["singles"]
    line(
        "detached_poll_cycle",
        f"{batched['elapsed']:.2f}",
        "s",
        f"{args.detached} jobs on {batched['records']} Replicate records at {args.poll_latency_ms:g} ms per request: "
        f"{batched['pages']} list pages "
        f"+ {batched['singles']} single checks; old: 500 jobs took 21.5 s by single checks; the cycle is 30 s",
    )
    line(
        "detached_poll_queries_per_job",
        f"{batched['queries'] / args.detached:.3f}",
        "queries",
        f"claim + apply in sets; {requests_made} status requests; old: 4.5 queries per check",
    )
    line("detached_poll_status", "; ".join(batched["behind"]) or "keeping up", "", "the queue status after the cycle")
    if args.single_detached:
        # The same provider with its list endpoint left unused: one request a task, spaced
        # to the 3,000 a minute (50 a second) budget — the old figure's setting.
        real_batch_size = poller._batch_size
        poller._batch_size = lambda family: 1
        try:
            single = cycle("replicate-single", args.single_detached)
        finally:
            poller._batch_size = real_batch_size
        floor = max(args.single_detached * args.poll_latency_ms / 1000 / single["per_provider"], args.single_detached / 50)
        line(
            "detached_poll_cycle_single_checks",
            f"{single['elapsed']:.2f}",
            "s",
            f"{args.single_detached} jobs, one request each, {single['per_provider']} at once and 50/s budget "
            f"(floor {floor:.1f} s); old: 21.5 s for 500",
        )
        line(
            "detached_poll_queries_per_single_check",
            f"{single['queries'] / max(1, single['singles']):.2f}",
            "queries",
            "claim + re-read + apply; old: 4.5",
        )
    from queue_app.providers import budget

    # A family with no list endpoint at its undocumented-limit default: what the monitor
    # would report for the same number of tasks.
    planned = budget.shortfall("runninghub", {}, args.detached)
    line(
        "detached_poll_behind_without_a_list",
        planned.tasks if planned else 0,
        "tasks",
        f"{args.detached} tasks at one request each and 600/min: cycle ≈ {planned.cycle_seconds:.0f} s, shown as polling behind"
        if planned
        else "keeping up",
    )
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
