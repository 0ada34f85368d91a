"""Attempt tallies: the attempt log rolled up per hour, and the counts of deleted attempts.

`roll_up` (the queue service, every minute) moves attempts that ended before a mark into
hourly AttemptTally rows and per provider and outcome AttemptTotal rows; /metrics reads the
totals plus the log past the mark, a constant cost whatever the history's size. Clearing
failed jobs, deleting drafts, a project or a user, and pruning delete attempt rows: before
they go, `fold` counts the ones not rolled up yet, in the caller's transaction. Both lock
the mark, so an attempt is counted on exactly one side and no counter ever falls.
"""

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Min, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from queue_app.engine.duration_sql import EpochBin, LeBucket, durations
from queue_app.models import AttemptTally, AttemptTotal, JobAttempt, RollupMark, Status

# Upper bounds (seconds) of the histogram buckets: queue wait and attempt run time.
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
RUN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ROLLUP_STEP = timedelta(hours=1)


def _group():
    return {
        "ended": 0,
        "run_ms": 0,
        "run_buckets": [0] * (len(RUN_BUCKETS) + 1),
        "wait_count": 0,
        "wait_ms": 0,
        "wait_buckets": [0] * (len(WAIT_BUCKETS) + 1),
    }


def _groups(attempts) -> dict:
    """{(hour epoch, provider, owner, outcome): counts and buckets} of these attempts: two
    grouped queries with the history's own expressions, so each attempt lands in the bucket
    and milliseconds it had in the log."""
    groups: dict = defaultdict(_group)
    for kind, bounds in (("run", RUN_BUCKETS), ("wait", WAIT_BUCKETS)):
        rows, _ = durations(attempts, kind)
        rows = (
            rows.annotate(hour=EpochBin(Coalesce("finished_at", "started_at"), 3600), bucket=LeBucket(F("d"), bounds))
            .values("hour", "provider_id", "owner_id", "outcome", "bucket")
            .annotate(n=Count("*"), total=Sum("ms"))
            .order_by()
        )
        for row in rows:
            group = groups[(int(row["hour"]), row["provider_id"], row["owner_id"], row["outcome"])]
            group[f"{kind}_buckets"][row["bucket"]] += row["n"]
            group[f"{kind}_ms"] += int(row["total"] or 0)
            group["ended" if kind == "run" else "wait_count"] += row["n"]
    return groups


def _add(target, group: dict) -> None:
    for key in ("ended", "run_ms", "wait_count", "wait_ms"):
        setattr(target, key, getattr(target, key) + group[key])
    for key in ("run_buckets", "wait_buckets"):
        mine = getattr(target, key) or [0] * len(group[key])
        setattr(target, key, [a + b for a, b in zip(mine, group[key], strict=True)])


def _append(groups: dict) -> int:
    """The hourly tally rows inserted, the per provider and outcome totals added to (under
    the mark's lock, which serializes every writer of the totals). Returns ended attempts."""
    AttemptTally.objects.bulk_create(
        AttemptTally(hour=datetime.fromtimestamp(hour * 3600, UTC), provider_id=pid, owner_id=owner, outcome=outcome, **group)
        for (hour, pid, owner, outcome), group in groups.items()
    )
    per: dict = defaultdict(_group)
    for (_, pid, _, outcome), group in groups.items():
        _merge(per[(pid, outcome)], group)
    if per:
        outcomes = {outcome for _, outcome in per}
        totals = {(t.provider_id, t.outcome): t for t in AttemptTotal.objects.filter(outcome__in=outcomes)}
        for (pid, outcome), group in per.items():
            total = totals.get((pid, outcome)) or AttemptTotal(provider_id=pid, outcome=outcome)
            _add(total, group)
            total.save()
    return sum(group["ended"] for group in groups.values())


def _merge(into: dict, group: dict) -> None:
    for key, value in group.items():
        into[key] = [a + b for a, b in zip(into[key], value, strict=True)] if isinstance(value, list) else into[key] + value


def mark() -> RollupMark:
    """The roll-up mark, locked until the caller's transaction ends."""
    RollupMark.objects.get_or_create(id=1, defaults={"upto": EPOCH})
    return RollupMark.objects.select_for_update().get(id=1)


def fold(attempts) -> int:
    """Count these attempts (a JobAttempt queryset the caller deletes next, in its
    transaction) in the tallies and totals, those the roll-up has not counted yet. Returns
    how many ended attempts were folded."""
    with transaction.atomic():
        upto = mark().upto
        return _append(_groups(attempts.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=upto))))


def roll_up(*, now=None, steps: int = 24) -> int:
    """Move the attempts that ended up to ROLLUP_MARGIN_SECONDS ago into the hourly tallies
    and the totals, an hour of the log per transaction, at most `steps` of them. The log
    keeps its rows (retention deletes them later); /metrics then counts it only past the
    mark. The margin leaves the last minutes to the log: an attempt whose end commits later
    than that after its end time (or whose host's clock is that far behind) would be
    counted by neither side (no counter falls either way). Returns attempts rolled up."""
    target = (now or timezone.now()) - timedelta(seconds=settings.ROLLUP_MARGIN_SECONDS)
    rolled = 0
    for _ in range(steps):
        with transaction.atomic():
            row = mark()
            if row.upto >= target:
                break
            start = row.upto
            if start == EPOCH:  # the first roll-up starts at the log's first end
                start = JobAttempt.objects.filter(finished_at__isnull=False).aggregate(m=Min("finished_at"))["m"] or target
            end = min(target, start + ROLLUP_STEP)
            rolled += _append(_groups(JobAttempt.objects.filter(finished_at__gte=row.upto, finished_at__lt=end)))
            row.upto = end
            row.save(update_fields=["upto"])
    return rolled


def fold_jobs(job_ids) -> int:
    """Fold the attempts of jobs about to be deleted (cleared, deleted drafts)."""
    return fold(JobAttempt.objects.filter(job_id__in=list(job_ids)))


def prune(*, older_than: timedelta, batch: int = 500, now=None) -> int:
    """Delete up to `batch` attempts that ended before `now - older_than`, of jobs that
    completed (a failed job may be retried and numbers its attempts from the log), folding
    them first. One short transaction; the caller loops while it returns `batch`."""
    cutoff = (now or timezone.now()) - older_than
    with transaction.atomic():
        ids = list(
            JobAttempt.objects.filter(finished_at__lt=cutoff, job__status=Status.COMPLETED)
            .order_by("finished_at")
            .values_list("id", flat=True)[:batch]
        )
        if not ids:
            return 0
        doomed = JobAttempt.objects.filter(id__in=ids)
        fold(doomed)
        return doomed.delete()[0]


def fold_project(sender, instance, **kwargs):
    """pre_delete of a Project (its own deletion, or its owner's): its jobs' attempts go
    with it. Jobs always belong to a project, so this covers a deleted user too."""
    fold(JobAttempt.objects.filter(job__project_id=instance.pk))
