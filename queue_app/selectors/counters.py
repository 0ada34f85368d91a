"""The counters /metrics exports: the totals of attempts rolled up or deleted
(engine/attempt_tally.py, one row per provider and outcome) plus the log past the roll-up
mark (its last minutes and open attempts): a constant cost, and no counter ever falls.

An attempt counts once it has ended (its `finished_at` is set exactly once and its outcome
never changes after); open attempts are a gauge, not a counter. The caller reads these in
one snapshot (metrics.QueueCollector), so an attempt moving from the log to the totals in
a commit between two queries is never counted twice or not at all.
"""

from collections import defaultdict

from django.db.models import Count, Q

from queue_app.engine.attempt_tally import EPOCH
from queue_app.models import AttemptTotal, JobAttempt, RollupMark
from queue_app.selectors import history

Outcome = JobAttempt.Outcome


def rolled_up_to():
    """Attempts that ended before this are counted in the totals, not from the log."""
    return RollupMark.objects.filter(id=1).values_list("upto", flat=True).first() or EPOCH


def ended_attempts(*, upto=None) -> dict:
    """{(provider_id, outcome): attempts that ended so} over the whole installation."""
    upto = rolled_up_to() if upto is None else upto
    totals: dict = defaultdict(int)
    live = JobAttempt.objects.filter(finished_at__gte=upto).values("provider_id", "outcome").annotate(n=Count("*"))
    for row in live.order_by():
        totals[(row["provider_id"], row["outcome"])] += row["n"]
    for provider_id, outcome, n in AttemptTotal.objects.filter(ended__gt=0).values_list("provider_id", "outcome", "ended"):
        totals[(provider_id, outcome)] += n
    return dict(totals)


def open_attempts() -> dict:
    """{phase: open attempts}: a gauge (they end, and leave it)."""
    rows = JobAttempt.objects.filter(finished_at__isnull=True).values("phase").annotate(n=Count("*")).order_by()
    counts = {phase.value: 0 for phase in JobAttempt.Phase}
    counts.update({row["phase"]: row["n"] for row in rows})
    return counts


def histograms(*, upto=None) -> dict:
    """{"wait": histogram, "run": histogram} as history.duration_histogram answers them:
    the log past the mark (and open attempts' waits) plus the totals' buckets and
    milliseconds (integers: the sums stay exact)."""
    upto = rolled_up_to() if upto is None else upto
    unrolled = JobAttempt.objects.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=upto))
    answer = {kind: history.duration_histograms(kind, base=unrolled, by_provider=False)["all"] for kind in ("wait", "run")}
    extra = {kind: {"counts": defaultdict(int), "ms": 0} for kind in ("wait", "run")}
    for run_buckets, run_ms, wait_buckets, wait_ms in AttemptTotal.objects.values_list(
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
