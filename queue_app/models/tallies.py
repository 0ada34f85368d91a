"""What the attempt log counted, kept when its rows go (engine/attempt_tally.py writes it)."""

from django.db import models


class AttemptTally(models.Model):
    """Counts of deleted attempts (cleared or deleted jobs, pruned history), grouped by the
    hour an attempt ended (or started, when it was still open), provider, owner and
    outcome. Rows are only ever inserted: /metrics adds them to the live log's counts, so
    its counters never fall when attempts are deleted. Bucket lists are per-bucket counts
    (not cumulative) over the bounds of selectors/history.py, the last one past them."""

    hour = models.DateTimeField()
    provider_id = models.IntegerField(null=True, blank=True)
    owner_id = models.IntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=14)
    ended = models.IntegerField(default=0)  # attempts that had ended with `outcome`
    run_ms = models.BigIntegerField(default=0)  # whole milliseconds: sums stay exact
    run_buckets = models.JSONField(default=list)
    wait_count = models.IntegerField(default=0)  # first attempts: queued -> taken
    wait_ms = models.BigIntegerField(default=0)
    wait_buckets = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["hour"], name="tally_hour")]

    def __str__(self):
        return f"{self.ended} {self.outcome} of provider {self.provider_id} at {self.hour:%Y-%m-%d %H:00}"


class AttemptTotal(models.Model):
    """Every attempt ever rolled up or deleted, summed per provider and outcome: one row
    each, so /metrics reads a constant number of rows whatever the history's size. The
    hourly AttemptTally rows and these grow together, in the same transactions."""

    provider_id = models.IntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=14)
    ended = models.BigIntegerField(default=0)
    run_ms = models.BigIntegerField(default=0)
    run_buckets = models.JSONField(default=list)
    wait_count = models.BigIntegerField(default=0)
    wait_ms = models.BigIntegerField(default=0)
    wait_buckets = models.JSONField(default=list)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider_id", "outcome"], name="total_per_provider_outcome")]

    def __str__(self):
        return f"{self.ended} {self.outcome} of provider {self.provider_id}"


class RollupMark(models.Model):
    """One row: attempts that ended before `upto` are rolled up into the tallies and
    totals; the log counts only the ones after it (and open ones). Locked by every roll-up
    and every deletion that folds, so an attempt is counted by exactly one side."""

    upto = models.DateTimeField()

    def __str__(self):
        return f"rolled up to {self.upto:%Y-%m-%d %H:%M}"
