"""A claim's cost against the backlog behind it.

    python -m bench.claim_backlog [--database-url URL] [--pending 100000] [--claims 200] [--projects 1] [--budget]

One provider at concurrency 1 with `--pending` jobs started at once (one queued_at, as
"start all" gives them), spread over `--projects` projects on it (fair share orders them),
and `--claims` times: dispatch claims the next job into the slot, which then leaves it at
once (no worker runs it). Prints the claim's median and p95 and the claims per second. A
claim's cost should follow what it claims, not the backlog. `--budget`: the record has a
price and a monthly budget it never reaches, so every claim checks it (docs/money.md): its
figures, named `…_budget`, sit beside the run without (goal: within 10 %).
"""

import argparse
import sys
import time

from bench import runner
from bench.figures import emit

ROOT = runner.ROOT


def fill(user, provider, *, projects: int, pending: int) -> None:
    """`pending` jobs started at once, spread over `projects` projects on the provider."""
    from django.utils import timezone

    from queue_app.models import Job, Project, Status

    made = Project.objects.bulk_create(
        [Project(owner=user, name=f"backlog {n}", provider=provider, model="demo-text", kind="text") for n in range(projects)]
    )
    now = timezone.now()
    for start in range(0, pending, 5000):
        count = min(pending, start + 5000) - start
        Job.objects.bulk_create(
            [
                Job(project=made[(start + n) % projects], owner=user, prompt="p", status=Status.PENDING, queued_at=now)
                for n in range(count)
            ]
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--database", default=runner.prefixed("rs_bench_backlog"))
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--projects", type=int, default=1)
    parser.add_argument("--budget", action="store_true", help="a price and a budget on the record")
    args = parser.parse_args(argv)
    var = runner.fresh_dir(ROOT / "var" / "bench" / ("backlog-pg" if args.database_url else "backlog-sqlite"))
    url = runner.database_url(args.database_url, args.database, var / "b.sqlite3")
    label = "postgresql" if args.database_url else "sqlite"
    stack = runner.Stack(
        database_url=url, cluster_name=runner.prefixed("rs_bench_backlog"), var_dir=var, extra=dict(LOG_LEVEL="WARNING")
    )
    stack.prepare()
    from django.contrib.auth import get_user_model
    from django.db import connection

    from queue_app.engine import dispatch, enqueue
    from queue_app.models import Job, Provider, Status

    enqueue.enqueue_task = lambda func, *args: None  # no broker: the claims only are timed
    user = get_user_model().objects.create_user(username="bench", password="bench-pw-unused")
    options = {"latency_ms": 0} | ({"prices": {"*": "0.01"}, "budget_month": 1e9} if args.budget else {})
    provider = Provider.objects.create(owner=user, name="backlog", family="demo", concurrency=1, options=options)
    fill(user, provider, projects=args.projects, pending=args.pending)
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
    where = f"at {args.pending} pending" + (f" over {args.projects} projects" if args.projects > 1 else "")
    median, p95 = timings[len(timings) // 2] * 1000, timings[int(len(timings) * 0.95)] * 1000
    name = ("claim_at_backlog" if args.projects == 1 else "claim_over_projects") + ("_budget" if args.budget else "")
    goal = dict(goal="<= 5 ms", met=median <= 5) if args.projects > 1 and args.database_url else {}
    emit(f"{name}_median", f"{median:.2f}", "ms", where, stack=label, **goal)
    emit(f"{name}_p95", f"{p95:.2f}", "ms", where, stack=label)
    emit(
        ("claims_per_second" if args.projects == 1 else "claims_over_projects_per_second") + ("_budget" if args.budget else ""),
        f"{len(timings) / sum(timings):.0f}",
        "claims/s",
        stack=label,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
