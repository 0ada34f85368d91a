"""The attempt log's one write after creation: how an attempt ended.

Append-only rows (JobAttempt) are created when a worker, collector or runner starts on a
job and finished exactly once: the update matches only a row still "running", so a late
writer (a stale worker, a heal that got there first) changes nothing."""

from django.utils import timezone

from queue_app.models import JobAttempt


def attempt_finish(attempt_id, outcome: str, reason: str = "", task_id: str = "") -> bool:
    fields = dict(finished_at=timezone.now(), outcome=outcome, reason=reason[:2000])
    if task_id:
        fields["task_id"] = task_id
    return bool(JobAttempt.objects.filter(id=attempt_id, outcome=JobAttempt.Outcome.RUNNING).update(**fields))
