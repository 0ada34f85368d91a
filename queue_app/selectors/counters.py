"""The counters /metrics exports: what the attempt log holds plus the tallies of the
attempts deleted from it (engine/attempt_tally.py), so no counter ever falls.

An attempt counts once it has ended (its `finished_at` is set exactly once and its outcome
never changes after); open attempts are a gauge, not a counter. The caller reads these in
one snapshot (metrics.QueueCollector), so an attempt moving from the log to the tallies in
a commit between two queries is never counted twice or not at all.
"""

from collections import defaultdict

from django.db.models import Count, Sum

from queue_app.models import AttemptTally, JobAttempt
from queue_app.selectors import history

Outcome = JobAttempt.Outcome


def ended_attempts() -> dict:
    """{(provider_id, outcome): attempts that ended so} over the whole installation."""
    totals: dict = defaultdict(int)
    live = JobAttempt.objects.filter(finished_at__isnull=False).values("provider_id", "outcome").annotate(n=Count("*"))
    gone = AttemptTally.objects.filter(ended__gt=0).values("provider_id", "outcome").annotate(n=Sum("ended"))
    for rows in (live.order_by(), gone.order_by()):
        for row in rows:
            totals[(row["provider_id"], row["outcome"])] += row["n"]
    return dict(totals)


def open_attempts() -> dict:
    """{phase: open attempts}: a gauge (they end, and leave it)."""
    rows = JobAttempt.objects.filter(finished_at__isnull=True).values("phase").annotate(n=Count("*")).order_by()
    counts = {phase.value: 0 for phase in JobAttempt.Phase}
    counts.update({row["phase"]: row["n"] for row in rows})
    return counts


def histograms() -> dict:
    """{"wait": histogram, "run": histogram} as history.duration_histogram answers them,
    the tallies' buckets and milliseconds added (integers: the sums stay exact)."""
    answer = {kind: history.duration_histogram(kind) for kind in ("wait", "run")}
    extra = {kind: {"counts": defaultdict(int), "ms": 0} for kind in ("wait", "run")}
    for run_buckets, run_ms, wait_buckets, wait_ms in AttemptTally.objects.values_list(
        "run_buckets", "run_ms", "wait_buckets", "wait_ms"
    ):
        for kind, buckets, ms in (("run", run_buckets, run_ms), ("wait", wait_buckets, wait_ms)):
            for index, n in enumerate(buckets):
                extra[kind]["counts"][index] += n
            extra[kind]["ms"] += ms
    for kind, histogram in answer.items():
        counts, running, cumulative = extra[kind]["counts"], 0, []
        for index, (bound, n) in enumerate(histogram["buckets"]):
            running += counts[index]
            cumulative.append((bound, n + running))
        ms = histogram["sum_ms"] + extra[kind]["ms"]
        histogram.update(buckets=cumulative, count=histogram["count"] + sum(counts.values()), sum=ms / 1000, sum_ms=ms)
    return answer
