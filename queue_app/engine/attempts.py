"""The attempt log: one row per try at a job, opened when a worker, collector or runner
takes the job's lease, and finished exactly once: the update matches only a row still
"running", so a late writer (a stale worker, a heal that got there first) changes nothing."""

from django.db import transaction
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.engine.leases import lease_take
from queue_app.models import Job, JobAttempt


def attempt_begin(job: Job, token) -> JobAttempt | None:
    """This worker takes the job's lease and opens its attempt; None when the job is no
    longer ours under `token` (healed, cleared, or taken by another worker)."""
    worker = heartbeats.process_name()
    # One transaction: a worker that dies in between leaves no lease without its attempt
    # (healing records the interrupted attempt it finds), and the write lock is taken once.
    with transaction.atomic():
        if not lease_take(job.id, token, owner=worker):
            return None
        return JobAttempt.objects.create(job=job, number=job.attempts, worker=worker, task_id=job.task_id)


def attempt_finish(attempt_id, outcome: str, reason: str = "", task_id: str = "") -> bool:
    fields = dict(finished_at=timezone.now(), outcome=outcome, reason=reason[:2000])
    if task_id:
        fields["task_id"] = task_id
    return bool(JobAttempt.objects.filter(id=attempt_id, outcome=JobAttempt.Outcome.RUNNING).update(**fields))


def attempt_record(job: Job, *, outcome: str, reason: str, worker: str = "poller") -> None:
    JobAttempt.objects.create(
        job_id=job.id,
        number=job.attempts,
        worker=worker,
        task_id=job.task_id,
        finished_at=timezone.now(),
        outcome=outcome,
        reason=reason[:2000],
    )
