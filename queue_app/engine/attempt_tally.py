"""Attempt tallies: the counts of attempts whose rows are deleted, kept in AttemptTally.

Clearing failed jobs, deleting drafts, a project or a user, and pruning old history delete
attempt rows. Before they go, `fold` appends their counts (per hour, provider, owner and
outcome) and their wait and run time histogram buckets, in the caller's transaction. The
history and /metrics read the log plus these rows, so a counter never falls when history
is deleted: the attempt moves from one table to the other in one commit.
"""

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Count, F, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from queue_app.engine.duration_sql import EpochBin, LeBucket, durations
from queue_app.models import AttemptTally, JobAttempt, Status

# Upper bounds (seconds) of the histogram buckets: queue wait and attempt run time.
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
RUN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def _group():
    return {
        "ended": 0,
        "run_ms": 0,
        "run_buckets": [0] * (len(RUN_BUCKETS) + 1),
        "wait_count": 0,
        "wait_ms": 0,
        "wait_buckets": [0] * (len(WAIT_BUCKETS) + 1),
    }


def fold(attempts) -> int:
    """Append the tallies of these attempts (a JobAttempt queryset the caller deletes next,
    in its transaction): two grouped queries with the history's own expressions, so each
    attempt lands in the bucket and milliseconds it had in the log. Returns how many
    ended attempts were folded."""
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
    AttemptTally.objects.bulk_create(
        AttemptTally(hour=datetime.fromtimestamp(hour * 3600, UTC), provider_id=pid, owner_id=owner, outcome=outcome, **group)
        for (hour, pid, owner, outcome), group in groups.items()
    )
    return sum(group["ended"] for group in groups.values())


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
