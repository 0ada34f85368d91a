"""One detached poll cycle at scale, for bench/recovery_scan.py.

`Cycles.run(name, count)` makes `count` detached jobs, all still processing at a fake
Replicate server that answers each status request (a single check or a list page) after
the given latency, on records of at most 1,000 slots (the concurrency limit's bound), each
with its own key; then steps the queue service's Poller once a second until every task
was checked once (one 30 s cycle's worth of work), and says how long that took, with the
status requests and SQL queries it made. `report` prints the figures: through the list of
predictions, then one request a task, then what a family without a list would show.
"""

import threading
import time
import uuid
from datetime import timedelta

from bench.figures import emit

CYCLE_GOAL_SECONDS = 30
MODEL = "black-forest-labs/flux-schnell"


class QueryCounter:
    """Counts SQL statements from every thread (Django's capture is per connection)."""

    def __init__(self):
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, execute, sql, params, many, context):
        with self.lock:
            self.count += 1
        return execute(sql, params, many, context)


class Cycles:
    def __init__(self, *, fake, user, latency_ms: float, parallelism: int | None, now):
        from django.db.backends.signals import connection_created

        self.fake, self.user, self.latency_ms, self.parallelism, self.now = fake, user, latency_ms, parallelism, now
        self.counter = QueryCounter()

        def instrument(sender, connection, **kwargs):
            # Once per connection object: a thread that reconnects fires this again.
            if self.counter not in connection.execute_wrappers:
                connection.execute_wrappers.append(self.counter)

        self.instrument = instrument  # the signal holds its receivers weakly
        connection_created.connect(instrument)

    def records(self, name: str, count: int) -> list[tuple]:
        """Replicate provider records for `count` tasks, at most CONCURRENCY.high each."""
        from queue_app.limits import CONCURRENCY
        from queue_app.models import Provider

        records = []
        for start in range(0, count, CONCURRENCY.high):
            size = min(CONCURRENCY.high, count - start)
            key = f"r8_bench_{name}_" + uuid.uuid4().hex
            self.fake.configure(key, family="replicate", latency=(1e9, 1e9)).poll_delay = self.latency_ms / 1000
            provider = Provider(
                owner=self.user,
                name=f"{name}-{start // CONCURRENCY.high}",
                family="replicate",
                base_url=f"{self.fake.url}/v1",
                concurrency=size,
                max_attempts=4,
            )
            provider.api_key = key
            provider.save()
            records.append((key, provider, size))
        return records

    def detach(self, records) -> None:
        """A still-running prediction at the fake and a detached job for every slot."""
        from django.utils import timezone

        from queue_app.models import Job, Project, Status
        from tests.fakes.chaos_provider import Prediction

        batch = []
        for key, provider, size in records:
            project = Project.objects.create(owner=self.user, name=provider.name, provider=provider, model=MODEL)
            created = time.time()
            for n in range(size):
                prediction_id = uuid.uuid4().hex[:26]
                self.fake.predictions[prediction_id] = Prediction(
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
                        owner=self.user,
                        prompt="p",
                        status=Status.PROCESSING,
                        active_provider=provider,
                        slot=n,
                        lease_token=uuid.uuid4(),
                        task_id=prediction_id,
                        task_observed_at=timezone.now(),
                        next_poll_at=timezone.now() - timedelta(seconds=1),
                        attempts=1,
                        started_at=self.now,
                        resolved={"kind": "image", "model": MODEL, "family": "replicate"},
                    )
                )
        Job.objects.bulk_create(batch, batch_size=2000)

    def run(self, name: str, count: int) -> dict:
        from django.db import connections

        from queue_app.models import Job
        from queue_app.queue_service import poll_pool
        from queue_app.selectors.queue import queue_status
        from queue_app.web.metrics import EVERYONE

        records = self.records(name, count)
        self.detach(records)
        for conn in connections.all():
            conn.close()
        keys = {key for key, _, _ in records}

        def polled() -> int:
            with self.fake.lock:
                return sum(1 for p in self.fake.predictions.values() if p.key in keys and (p.polls or p.listed))

        self.counter.count = 0
        # As the queue service runs it: a step a second; the threads refill themselves between.
        pool = poll_pool.Poller(parallelism=self.parallelism)
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
        queries = self.counter.count
        status = queue_status(user=EVERYONE, breakdown="providers")
        ids = {provider.id for _, provider, _ in records}
        behind = [row["polling_message"] for row in status["providers"] if row["id"] in ids and row["polling_message"]]
        Job.objects.filter(active_provider_id__in=ids).delete()
        return dict(
            elapsed=elapsed,
            queries=queries,
            singles=sum(len(self.fake.entries(key, "poll")) for key in keys),
            pages=sum(len(self.fake.entries(key, "list")) for key in keys),
            per_provider=pool.per_provider,
            records=len(records),
            behind=behind,
        )


def report(cycles: Cycles, *, detached: int, single_detached: int, stack: str) -> None:
    """The list endpoint (a page of 100 a request, within Replicate's 3,000 a minute), then
    one request a task, then a family without a list at its default budget."""
    from queue_app.providers import budget
    from queue_app.queue_service import poll_pool

    latency = cycles.latency_ms
    batched = cycles.run("replicate-list", detached)
    requests_made = batched["pages"] + batched["singles"]
    emit(
        "detached_poll_cycle",
        f"{batched['elapsed']:.2f}",
        "s",
        f"{detached} jobs on {batched['records']} Replicate records at {latency:g} ms per request: "
        f"{batched['pages']} list pages "
        f"+ {batched['singles']} single checks; old: 500 jobs took 21.5 s by single checks; the cycle is 30 s",
        stack=stack,
        goal=f"< {CYCLE_GOAL_SECONDS} s",
        met=batched["elapsed"] < CYCLE_GOAL_SECONDS,
    )
    emit(
        "detached_poll_queries_per_job",
        f"{batched['queries'] / detached:.3f}",
        "queries",
        f"claim + apply in sets; {requests_made} status requests; old: 4.5 queries per check",
        stack=stack,
    )
    emit(
        "detached_poll_status", "; ".join(batched["behind"]) or "keeping up", "", "the queue status after the cycle", stack=stack
    )
    if single_detached:
        # The same provider with its list endpoint left unused: one request a task, spaced
        # to the 3,000 a minute (50 a second) budget — the old figure's setting.
        real_batch_size = poll_pool._batch_size
        poll_pool._batch_size = lambda family: 1
        try:
            single = cycles.run("replicate-single", single_detached)
        finally:
            poll_pool._batch_size = real_batch_size
        report_single(single, single_detached, latency, stack)
    # A family with no list endpoint at its undocumented-limit default: what the monitor
    # would report for the same number of tasks.
    planned = budget.shortfall("runninghub", {}, detached)
    emit(
        "detached_poll_behind_without_a_list",
        planned.tasks if planned else 0,
        "tasks",
        f"{detached} tasks at one request each and 600/min: cycle ≈ {planned.cycle_seconds:.0f} s, shown as polling behind"
        if planned
        else "keeping up",
        stack=stack,
    )


def report_single(single: dict, count: int, latency_ms: float, stack: str) -> None:
    floor = max(count * latency_ms / 1000 / single["per_provider"], count / 50)
    emit(
        "detached_poll_cycle_single_checks",
        f"{single['elapsed']:.2f}",
        "s",
        f"{count} jobs, one request each, {single['per_provider']} at once and 50/s budget "
        f"(floor {floor:.1f} s); old: 21.5 s for 500",
        stack=stack,
    )
    emit(
        "detached_poll_queries_per_single_check",
        f"{single['queries'] / max(1, single['singles']):.2f}",
        "queries",
        "claim + re-read + apply; old: 4.5",
        stack=stack,
    )
