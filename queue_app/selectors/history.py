"""The queue's history, read from the append-only attempt log: the monitor's charts, the
Prometheus histograms and the alerts (the live numbers are `queue.queue_status`'s).

Outcome counts, wait and run time histograms (bucketed by the database in one pass, so
percentiles need no percentile functions), throughput per time bin, failure rates and
per-provider alerts. Each is a constant number of queries over one index-backed time
window of the attempt log alone: an attempt carries its job's provider, owner and queued
time from when it opens, so nothing joins the jobs (that join scanned all of them).
"""

from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from queue_app.engine import attempt_tally
from queue_app.engine.duration_sql import EpochBin, LeBucket, durations
from queue_app.models import JobAttempt

Outcome = JobAttempt.Outcome

# Ends of an attempt that count as a failure in the charts and the failure rate: the
# provider or our call failed. An attempt whose worker stopped (interrupted, lost), whose
# answer never came (ambiguous) or that was cancelled did not fail: a clean restart of a
# worker or a ComfyUI instance is counted apart ("lost"), never in red. A "detached"
# attempt handed its remote task to the poller; "running" has not ended.
FAILED_OUTCOMES = tuple(
    o.value for o in (Outcome.PERMANENT, Outcome.TRANSIENT, Outcome.RATE_LIMITED, Outcome.TIMEOUT, Outcome.LOCAL)
)
LOST_OUTCOMES = tuple(o.value for o in (Outcome.INTERRUPTED, Outcome.LOST, Outcome.AMBIGUOUS, Outcome.CANCELLED))

# The histograms' bounds, shared with the tallies of deleted attempts.
WAIT_BUCKETS, RUN_BUCKETS = attempt_tally.WAIT_BUCKETS, attempt_tally.RUN_BUCKETS

RANGES = {
    # name: (window, bin) — a bin of the day chart is 15 minutes: 96 points, not 1,440
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=15)),
}


def _visible(user):
    attempts = JobAttempt.objects.all()
    return attempts if user is None or user.is_staff else attempts.filter(owner=user)


def attempt_outcomes(*, user=None) -> dict:
    """{outcome: attempts} over the whole log, every outcome present (zeros too)."""
    counts = dict(_visible(user).values("outcome").annotate(n=Count("id")).order_by().values_list("outcome", "n"))
    return {o.value: counts.get(o.value, 0) for o in Outcome}


def _durations(kind: str, user, base=None):
    """(queryset with `d` (seconds) and `ms` annotations, the time field the window applies
    to), of `base` (attempts) when given, else of the attempts the user sees."""
    return durations(_visible(user) if base is None else base, kind)


def duration_histogram(kind: str, *, user=None, since=None) -> dict:
    """{"buckets": [(upper bound seconds, cumulative count)...], "count", "sum", "sum_ms"} of queue
    waits (`kind="wait"`) or run times (`kind="run"`), one query."""
    return duration_histograms(kind, user=user, since=since, by_provider=False)["all"]


def duration_histograms(kind: str, *, user=None, since=None, by_provider: bool = True, base=None) -> dict:
    """{"all": histogram, provider_id: histogram, ...}: one grouped query. The database
    puts each row in its bucket once (a CASE that stops at the first bound it fits) and
    counts per bucket; the cumulative counts are summed here. "all" sums the providers'."""
    bounds = WAIT_BUCKETS if kind == "wait" else RUN_BUCKETS
    attempts, field = _durations(kind, user, base)
    if since is not None:
        attempts = attempts.filter(**{f"{field}__gte": since})
    bucket = LeBucket(F("d"), bounds)  # past the last bound: +Inf only
    keys = ["provider_id", "bucket"] if by_provider else ["bucket"]
    rows = attempts.annotate(bucket=bucket).values(*keys).annotate(n=Count("id"), total=Sum("ms")).order_by()
    per: dict = defaultdict(lambda: {"counts": [0] * (len(bounds) + 1), "ms": 0})
    for row in rows:
        for key in (row["provider_id"], "all") if by_provider else ("all",):
            per[key]["counts"][row["bucket"]] += row["n"]
            per[key]["ms"] += int(row["total"] or 0)
    per["all"]  # an empty log still answers an empty histogram
    answer = {}
    for key, found in per.items():
        cumulative, running = [], 0
        for b, n in zip(bounds, found["counts"], strict=False):
            running += n
            cumulative.append((b, running))
        count, ms = sum(found["counts"]), found["ms"]
        answer[key] = {"buckets": cumulative, "count": count, "sum": ms / 1000, "sum_ms": ms}
    return answer


def percentiles(histogram: dict, qs=(0.5, 0.95, 0.99)) -> dict:
    """{"p50": seconds | None, ...} read off a cumulative histogram; a quantile past the
    last bound answers that bound (the histogram knows no more)."""
    count = histogram["count"]
    answer = {}
    for q in qs:
        key = f"p{round(q * 100)}"
        if not count:
            answer[key] = None
            continue
        rank = q * count
        lower, below = 0.0, 0
        value = histogram["buckets"][-1][0] if histogram["buckets"] else None
        for bound, cumulative in histogram["buckets"]:
            if cumulative >= rank:
                inside = cumulative - below
                value = lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
                break
            lower, below = bound, cumulative
        answer[key] = value
    return answer


def throughput(*, user=None, range_name: str = "hour", now=None) -> dict:
    """Attempts that ended completed / failed / lost per bin over the last hour (1-minute
    bins) or day (15-minute bins), per provider id: {"bins": [start datetimes], "providers":
    {provider_id: {"completed": [n per bin], "failed": [...], "lost": [...], "rate_limited":
    [...]}}} (rate-limited attempts count as failed and are also counted apart; "lost" is
    LOST_OUTCOMES). One grouped query; the database bins the end times itself (EpochBin)."""
    window, step = RANGES.get(range_name, RANGES["hour"])
    now = now or timezone.now()
    step_seconds = int(step.total_seconds())
    end = _floor(now, step_seconds) + step
    start = end - window
    first_bin = int(start.timestamp()) // step_seconds
    rows = (
        _visible(user)
        .filter(finished_at__gte=start, finished_at__lt=end)
        .exclude(outcome__in=(Outcome.RUNNING, Outcome.DETACHED))
        .annotate(bin=EpochBin("finished_at", step_seconds))
        .values("bin", "provider_id", "outcome")
        .annotate(n=Count("id"))
        .order_by()
    )
    size = int(window / step)
    series: dict = defaultdict(lambda: {key: [0] * size for key in ("completed", "failed", "lost", "rate_limited")})
    for row in rows:
        index = int(row["bin"]) - first_bin
        if 0 <= index < size:
            series[row["provider_id"]][outcome_kind(row["outcome"])][index] += row["n"]
            if row["outcome"] == Outcome.RATE_LIMITED:  # a failure too; the hover names it
                series[row["provider_id"]]["rate_limited"][index] += row["n"]
    return {"bins": [start + step * i for i in range(size)], "step_seconds": step_seconds, "providers": dict(series)}


def outcome_kind(outcome: str) -> str:
    """ "completed", "failed" or "lost" (LOST_OUTCOMES): how the history counts an end."""
    if outcome == Outcome.COMPLETED:
        return "completed"
    return "lost" if outcome in LOST_OUTCOMES else "failed"


def _floor(moment, seconds: int):
    epoch = int(moment.timestamp())
    return moment - timedelta(seconds=epoch % seconds, microseconds=moment.microsecond)


def failure_rates(*, user=None, now=None, minutes: int = 5) -> dict:
    """{provider_id: (failed, ended)} of attempts that ended in the last `minutes`."""
    now = now or timezone.now()
    rows = (
        _visible(user)
        .filter(finished_at__gte=now - timedelta(minutes=minutes))
        .exclude(outcome__in=(Outcome.RUNNING, Outcome.DETACHED))
        .values("provider_id")
        .annotate(ended=Count("id"), failed=Count("id", filter=Q(outcome__in=FAILED_OUTCOMES)))
        .order_by()
    )
    return {row["provider_id"]: (row["failed"], row["ended"]) for row in rows}


def provider_alerts(status: dict, *, user=None, now=None, rates: dict | None = None) -> dict:
    """{provider_id: [{"kind", "message"}, ...]} for the providers of a
    `queue_status(breakdown="providers")` answer. Kinds: "wait" (oldest queued job over
    ALERT_WAIT_SECONDS), "failure_rate" (over ALERT_FAILURE_RATE of at least
    ALERT_MIN_ATTEMPTS attempts that ended in the last 5 minutes), "no_worker" (work and no
    live worker cluster / queue service to move it)."""
    rates = failure_rates(user=user, now=now) if rates is None else rates
    threshold_wait = settings.ALERT_WAIT_SECONDS
    threshold_rate = settings.ALERT_FAILURE_RATE
    alerts = {}
    for row in status.get("providers", []):
        found = []
        age = row.get("oldest_queued_age_seconds")
        if age is not None and age > threshold_wait:
            found.append({"kind": "wait", "message": f"oldest job waited {int(age)}s (over {int(threshold_wait)}s)"})
        failed, ended = rates.get(row["id"], (0, 0))
        if ended >= settings.ALERT_MIN_ATTEMPTS and failed / ended > threshold_rate:
            message = f"{failed} of {ended} attempts failed in 5 min (over {threshold_rate:.0%})"
            found.append({"kind": "failure_rate", "message": message})
        live = status.get("liveness") or {}
        if not live.get("workers") and (row["pending"] or row["running"] or row["stalled"]):
            found.append({"kind": "no_worker", "message": row.get("warning") or "jobs in its slots but no live worker cluster"})
        elif row["detached"] and not live.get("queue_services"):
            found.append(
                {"kind": "no_worker", "message": row.get("warning") or "detached jobs not polled: no live queue service"}
            )
        alerts[row["id"]] = found
    return alerts


ALERT_KINDS = ("wait", "failure_rate", "no_worker")
