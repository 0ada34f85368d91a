"""Prometheus metrics at /metrics, computed at scrape time.

No counter lives in a process: a custom collector reads the database when Prometheus
scrapes, so every web process answers the same numbers and nothing is written on the hot
path. The live numbers come from the queue status selector the monitor, the API and MCP
use (`queue_status`); attempts, queue wait and run time from the attempt log plus the
tallies of attempts deleted from it (`selectors/counters.py`), so the counters never fall
on a clear, a prune or a restart. The whole scrape reads one snapshot of the database, and
costs a constant number of queries.

Access: `Authorization: Bearer <METRICS_TOKEN>` (Prometheus' `authorization` /
`bearer_token` setting), or a staff session (to look at it in a browser). Everything else
answers 401 without a body worth reading. The README lists every metric.
"""

import hmac
from types import SimpleNamespace

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from queue_app.models import Heartbeat
from queue_app.selectors import counters, spend
from queue_app.selectors import history as selectors_history
from queue_app.selectors.queue import queue_status

# The whole installation, as staff see it (the selectors only read `is_staff`).
EVERYONE = SimpleNamespace(is_staff=True, pk=None, is_authenticated=True)

PROVIDER_GAUGES = (
    # (metric suffix, queue_status key, help)
    ("pending_jobs", "pending", "Jobs pending (queued or waiting) for the provider"),
    ("queued_jobs", "queued", "Pending jobs that can be dispatched (waiting only for a slot)"),
    ("waiting_jobs", "waiting", "Pending jobs nothing will dispatch now (paused, cooling down, backoff, no worker)"),
    ("processing_jobs", "processing", "Jobs processing (running, detached or stalled) in the provider's slots"),
    ("detached_jobs", "detached", "Processing jobs with a remote task id, polled"),
    ("failed_jobs", "failed", "Failed jobs not yet cleared"),
    ("slots_used", "active_slots", "Slots held by processing jobs"),
    ("slots_limit", "concurrency", "The provider's concurrency limit"),
)


# (metric name, help) of the per-provider gauges that are not a plain queue_status count.
PROVIDER_EXTRAS = {
    "oldest": ("rsq_provider_oldest_queued_age_seconds", "Age of the oldest dispatchable job (0 when none)"),
    "paused": ("rsq_provider_paused", "1 when the provider is paused"),
    "cooling": ("rsq_provider_cooling_down", "1 while the provider cools down after a 429"),
    "behind": (
        "rsq_provider_polling_behind_tasks",
        "Detached tasks the provider's status budget or late checks leave unchecked within their cadence",
    ),
    "cycle": ("rsq_provider_poll_cycle_seconds", "Seconds one round of status checks of every detached task takes (0 when none)"),
    "budget": ("rsq_provider_status_budget_per_minute", "Status requests a minute the poller may send (0: no detached task)"),
}
PROVIDER_LABELS = ["provider_id", "provider", "family"]

# Derived job states that partition the open jobs: every one is in exactly one, so sum()
# over `state` is the number of open jobs (pending = queued + waiting; processing =
# running + stalled + detached, exported apart under the per-provider names above).
PARTITION = ("queued", "waiting", "running", "stalled", "detached", "failed")


class QueueCollector(Collector):
    def __init__(self, *, now=None):
        self.now = now

    def collect(self):
        with snapshot():
            now = self.now or timezone.now()
            status = queue_status(user=EVERYONE, breakdown="providers", now=now)
            families = [*provider_metrics(status, selectors_history.provider_alerts(status, now=now))]
            families += [*partition_metrics(status), *queue_metrics(status), *history_metrics(), *spend_metrics()]
        return families


def snapshot():
    """One transaction that reads one snapshot: on PostgreSQL REPEATABLE READ (each
    statement of READ COMMITTED sees its own), on SQLite any read transaction. Inside an
    outer transaction (a test's), that one."""
    if connection.in_atomic_block:
        return transaction.atomic()

    class Snapshot:
        def __enter__(self):
            self.atomic = transaction.atomic()
            self.atomic.__enter__()
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")

        def __exit__(self, *exc):
            return self.atomic.__exit__(*exc)

    return Snapshot()


def provider_metrics(status: dict, alerts: dict):
    """One gauge family per provider number (slots, counts, cool-down, polling, alerts)."""
    gauges = {
        key: GaugeMetricFamily(f"rsq_provider_{suffix}", help_text, labels=PROVIDER_LABELS)
        for suffix, key, help_text in PROVIDER_GAUGES
    }
    extras = {
        key: GaugeMetricFamily(name, help_text, labels=PROVIDER_LABELS) for key, (name, help_text) in PROVIDER_EXTRAS.items()
    }
    alert = GaugeMetricFamily(
        "rsq_provider_alert",
        "1 when the alert is raised: wait (oldest job over ALERT_WAIT_SECONDS), failure_rate (5 min), no_worker",
        labels=[*PROVIDER_LABELS, "alert"],
    )
    for row in status["providers"]:
        values = [str(row["id"]), row["name"], row["family"]]
        for key, gauge in gauges.items():
            gauge.add_metric(values, row[key])
        extras["oldest"].add_metric(values, row["oldest_queued_age_seconds"] or 0)
        extras["paused"].add_metric(values, 1 if row["paused"] else 0)
        extras["cooling"].add_metric(values, 1 if row["cooling_down_until"] else 0)
        extras["behind"].add_metric(values, row["polling_behind"])
        extras["cycle"].add_metric(values, row["poll_cycle_seconds"] or 0)
        extras["budget"].add_metric(values, row["poll_budget_per_minute"] or 0)
        raised = {a["kind"] for a in alerts.get(row["id"], [])}
        for kind in selectors_history.ALERT_KINDS:
            alert.add_metric([*values, kind], 1 if kind in raised else 0)
    return [*gauges.values(), *extras.values(), alert]


def partition_metrics(status: dict):
    """Open jobs by a state that partitions them, per provider; the oldest pending job's
    age per provider whatever blocks it, the blocking reason its label."""
    jobs = GaugeMetricFamily(
        "rsq_provider_jobs",
        "Open jobs of the provider by derived state (the states partition)",
        labels=[*PROVIDER_LABELS, "state"],
    )
    oldest = GaugeMetricFamily(
        "rsq_provider_oldest_pending_age_seconds",
        "Age of the provider's oldest pending job, whatever blocks it (reason: dispatchable, paused, cooling_down, "
        "budget, backoff, no_worker, no_queue_service; none and 0 when nothing is pending)",
        labels=[*PROVIDER_LABELS, "reason"],
    )
    for row in status["providers"]:
        values = [str(row["id"]), row["name"], row["family"]]
        for state in PARTITION:
            jobs.add_metric([*values, state], row[state])
        oldest.add_metric([*values, row["oldest_pending_reason"]], row["oldest_pending_age_seconds"] or 0)
    return [jobs, oldest]


def queue_metrics(status: dict):
    """The whole installation's jobs by derived state, and its live processes by role."""
    totals = GaugeMetricFamily(
        "rsq_jobs", "Open jobs by derived state, whole installation (the states partition: sum() is all)", labels=["state"]
    )
    for key in PARTITION:
        totals.add_metric([key], status["totals"][key])
    processes = GaugeMetricFamily("rsq_live_processes", "Processes with a fresh heartbeat, by role", labels=["role"])
    processes.add_metric([Heartbeat.Role.WORKER.value], status["liveness"]["workers"])
    processes.add_metric([Heartbeat.Role.QUEUE_SERVICE.value], status["liveness"]["queue_services"])
    return [totals, processes]


def history_metrics():
    """Attempts ended by provider and outcome (a counter), open attempts by phase (a gauge),
    queue wait and run time histograms: the attempt log plus the deleted attempts' tallies."""
    attempts = CounterMetricFamily(
        "rsq_attempts", "Attempts that ended, by provider and outcome (deleted ones included)", labels=["provider_id", "outcome"]
    )
    upto = counters.rolled_up_to()
    ended = counters.ended_attempts(upto=upto)
    for (provider_id, outcome), n in sorted(ended.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        attempts.add_metric(["" if provider_id is None else str(provider_id), outcome], n)
    yield attempts
    opened = GaugeMetricFamily("rsq_open_attempts", "Attempts not ended yet, by phase", labels=["phase"])
    for phase, n in counters.open_attempts().items():
        opened.add_metric([phase], n)
    yield opened
    histograms = counters.histograms(upto=upto)
    for kind, name, help_text in (
        ("wait", "rsq_job_queue_wait_seconds", "From queued to a worker taking the job's first attempt"),
        ("run", "rsq_attempt_run_seconds", "From an attempt's start to its end"),
    ):
        histogram = histograms[kind]
        buckets = [(_bound(b), n) for b, n in histogram["buckets"]] + [("+Inf", histogram["count"])]
        yield HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=histogram["sum"])


def spend_metrics():
    """Money from the ledger (docs/money.md): spent per provider, currency and state (settled,
    held as possibly charged), a counter that never falls; reserved now, a gauge."""
    totals = spend.ledger_totals()
    spent = CounterMetricFamily(
        "rsq_spend",
        "Spent per provider record and currency: settled and possibly charged (held) lines",
        labels=["provider_id", "currency", "state"],
    )
    for (provider_id, currency, state), amount in totals["spent"].items():
        spent.add_metric([str(provider_id), currency, state], float(amount))
    yield spent
    reserved = GaugeMetricFamily("rsq_reserved", "Estimates held by running claims now", labels=["provider_id", "currency"])
    for (provider_id, currency), amount in totals["reserved"].items():
        reserved.add_metric([str(provider_id), currency], float(amount))
    yield reserved


def _bound(value) -> str:
    return repr(float(value))


def allowed(request) -> bool:
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
        return True
    return bool(request.user.is_authenticated and request.user.is_staff)


def render_metrics(*, now=None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(now=now))
    return generate_latest(registry)


@never_cache
@require_GET
def metrics_view(request):
    if not allowed(request):
        response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE_LATEST)
