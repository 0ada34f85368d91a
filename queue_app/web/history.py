"""The monitor's history and alerts: charts of attempts completed, failed and lost
(worker stopped, ambiguous or cancelled: not a failure) per minute
(last hour) or per 15 minutes (last day), per provider; queue wait and run time
percentiles; and the alerts on each provider row.

Everything comes from `selectors_history` (the append-only attempt log) at four queries
whatever the number of jobs; the monitor view adds this to its context, and the live part
refreshes it with the rest of the page.
"""

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from queue_app.selectors import history as selectors_history
from queue_app.web import charts

CHART_ROWS = 12  # providers with the most attempts in the window get a chart
RANGE_CHOICES = (("hour", "last hour"), ("day", "last day"))


def history_context(*, user, summary: dict, range_name: str = "hour", now=None) -> dict:
    """The history section and each provider row's alerts. The attempt-log part (charts,
    percentiles, 5-minute failure counts) is kept HISTORY_CACHE_SECONDS per user and range:
    the page refreshes every 4 s, minute bins do not need it, and that part is most of
    the page's time. The alerts read the live summary every time."""
    now = now or timezone.now()
    range_name = range_name if range_name in selectors_history.RANGES else "hour"
    seconds = settings.HISTORY_CACHE_SECONDS
    key = f"monitor-history:{user.pk}:{int(user.is_staff)}:{range_name}"
    cached = cache.get(key) if seconds > 0 else None
    if cached is None:
        cached = _from_attempt_log(user=user, summary=summary, range_name=range_name, now=now)
        if seconds > 0:
            cache.set(key, cached, seconds)
    rates = cached["rates"]
    alerts = selectors_history.provider_alerts(summary, user=user, now=now, rates=rates)
    for row in summary.get("providers", []):
        row["alerts"] = alerts.get(row["id"], [])
        failed, ended = rates.get(row["id"], (0, 0))
        row["failure_rate_5m"] = f"{failed}/{ended}" if ended else ""
    history = dict(
        cached["history"],
        alerting=sum(1 for row in summary.get("providers", []) if row.get("alerts")),
        kept_seconds=seconds if seconds > 0 else 0,
    )
    return {"history": history}


def _from_attempt_log(*, user, summary: dict, range_name: str, now) -> dict:
    window, _ = selectors_history.RANGES[range_name]
    since = now - window
    rates = selectors_history.failure_rates(user=user, now=now)

    series = selectors_history.throughput(user=user, range_name=range_name, now=now)
    waits = selectors_history.duration_histograms("wait", user=user, since=since)
    runs = selectors_history.duration_histograms("run", user=user, since=since)
    names = {row["id"]: row["name"] for row in summary.get("providers", [])}
    bins = series["bins"]
    size = len(bins)
    totals = {key: [0] * size for key in ("completed", "failed", "lost", "rate_limited")}
    rows = []
    for provider_id, counts in series["providers"].items():
        for key, values in totals.items():
            for i in range(size):
                values[i] += counts[key][i]
        rows.append((provider_id, counts))
    rows.sort(key=lambda item: -(sum(item[1]["completed"]) + sum(item[1]["failed"]) + sum(item[1]["lost"])))

    def entry(provider_id, name, counts):
        wait = selectors_history.percentiles(waits.get(provider_id) or _empty())
        run = selectors_history.percentiles(runs.get(provider_id) or _empty())
        return {
            "provider_id": provider_id,
            "name": name,
            "completed": sum(counts["completed"]),
            "failed": sum(counts["failed"]),
            "lost": sum(counts["lost"]),
            "chart": charts.throughput_svg(
                bins=bins,
                completed=counts["completed"],
                failed=counts["failed"],
                lost=counts["lost"],
                rate_limited=counts.get("rate_limited"),
                step_seconds=series["step_seconds"],
                label=f"{name}: attempts completed, failed and lost",
            ),
            "wait": {k: charts.seconds(v) for k, v in wait.items()},
            "run": {k: charts.seconds(v) for k, v in run.items()},
            "wait_count": (waits.get(provider_id) or _empty())["count"],
            "run_count": (runs.get(provider_id) or _empty())["count"],
        }

    charts_rows = [entry("all", "All providers", totals)]
    for provider_id, counts in rows[:CHART_ROWS]:
        name = names.get(provider_id) or ("no provider (runner)" if provider_id is None else f"provider {provider_id}")
        charts_rows.append(entry(provider_id, name, counts))
    return {
        "rates": rates,
        "history": {
            "range": range_name,
            "range_choices": RANGE_CHOICES,
            "rows": charts_rows,
            "more": max(0, len(rows) - CHART_ROWS),
            "since": since,
            "computed_at": now,
        },
    }


def _empty() -> dict:
    return {"buckets": [], "count": 0, "sum": 0.0}
