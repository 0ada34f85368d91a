"""A claim's cost against the backlog behind it.

    python -m bench.claim_backlog [--database-url URL] [--pending 100000] [--claims 200]

One provider at concurrency 1 with `--pending` jobs started at once (one queued_at, as
"start all" gives them) and `--claims` times: dispatch claims the next job into the slot,
which then leaves it at once (no worker runs it). Prints the claim's median and p95 and
the claims per second. A claim's cost should follow what it claims, not the backlog.
"""

import argparse
import sys
import time

from bench import runner

ROOT = runner.ROOT


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--database", default="rs_bench_backlog")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=200)
    args = parser.parse_args(argv)
    var = ROOT / "var" / "bench" / ("backlog-pg" if args.database_url else "backlog-sqlite")
    url = runner.with_database(args.database_url, args.database) if args.database_url else f"sqlite:///{var / 'b.sqlite3'}"
    label = "postgresql" if args.database_url else "sqlite"
    import shutil

    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    stack = runner.Stack(database_url=url, cluster_name="rs_bench_backlog", var_dir=var, extra=dict(LOG_LEVEL="WARNING"))
    stack.prepare()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from queue_app.engine import dispatch, enqueue
    from queue_app.models import Job, Project, Provider, Status

    enqueue.enqueue_task = lambda func, *args: None  # no broker: the claims only are timed
    user = get_user_model().objects.create_user(username="bench", password="bench-pw-unused")
    provider = Provider.objects.create(owner=user, name="backlog", family="demo", concurrency=1, options={"latency_ms": 0})
    project = Project.objects.create(owner=user, name="backlog", provider=provider, model="demo-text", kind="text")
    now = timezone.now()
    for start in range(0, args.pending, 5000):
        count = min(args.pending, start + 5000) - start
        Job.objects.bulk_create(
            [Job(project=project, owner=user, prompt="p", status=Status.PENDING, queued_at=now) for _ in range(count)]
        )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    timings = []
    for _ in range(args.claims):
        started = time.perf_counter()
        [(job_id, _token)] = dispatch.dispatch(provider.id)
        timings.append(time.perf_counter() - started)
        Job.objects.filter(id=job_id).update(
            status=Status.COMPLETED, active_provider=None, slot=None, lease_token=None, lease_owner="", lease_expires_at=None
        )
    timings.sort()
    median, p95 = timings[len(timings) // 2] * 1000, timings[int(len(timings) * 0.95)] * 1000
    print(f"bench.claim_at_backlog[{label}] median {median:.2f} ms, p95 {p95:.2f} ms at {args.pending} pending", flush=True)
    print(f"bench.claims_per_second[{label}] {len(timings) / sum(timings):.0f} claims/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
