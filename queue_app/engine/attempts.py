"""The attempt log: one row per try at a job, and the only module that writes it.

- `attempt_begin`: a worker, collector or runner takes the job's lease and opens its
  attempt in one transaction;
- `attempt_finish`: how it ended, exactly once: the update matches only a row still
  "running", so a late writer (a stale worker, a heal that got there first) changes nothing;
- `attempt_record`: an attempt that opens and ends in one step, for what a checker found
  without a worker (the poller's timeout, a ComfyUI check's failure);
- `attempts_interrupt`: the recovery scan ends the attempts of jobs whose worker is gone.
"""

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.engine.leases import lease_take
from queue_app.models import Job, JobAttempt

Outcome = JobAttempt.Outcome


def attempt_number(job: Job) -> int:
    """Attempts are numbered across the job's life: a retry (which starts `job.attempts`
    again at 0) continues after the highest number of the attempts before it."""
    before = JobAttempt.objects.filter(job_id=job.id)
    if job.queued_at:
        before = before.filter(started_at__lt=job.queued_at)
    earlier = before.aggregate(top=Max("number"))["top"] or 0
    return earlier + max(job.attempts, 1)


def attempt_begin(job: Job, token) -> JobAttempt | None:
    """This worker takes the job's lease and opens its attempt; None when the job is no
    longer ours under `token` (healed, cleared, or taken by another worker)."""
    worker = heartbeats.process_name()
    # One transaction: a worker that dies in between leaves no lease without its attempt
    # (healing records the interrupted attempt it finds), and the write lock is taken once.
    with transaction.atomic():
        if not lease_take(job.id, token, owner=worker):
            return None
        return JobAttempt.objects.create(job=job, number=attempt_number(job), worker=worker, task_id=job.task_id)


def attempt_finish(attempt_id, outcome: Outcome, reason: str = "", task_id: str = "") -> bool:
    fields = dict(finished_at=timezone.now(), outcome=outcome, reason=reason[:2000])
    if task_id:
        fields["task_id"] = task_id
    return bool(JobAttempt.objects.filter(id=attempt_id, outcome=Outcome.RUNNING).update(**fields))


def attempt_record(job: Job, *, outcome: Outcome, reason: str, worker: str) -> None:
    JobAttempt.objects.create(
        job_id=job.id,
        number=attempt_number(job),
        worker=worker,
        task_id=job.task_id,
        finished_at=timezone.now(),
        outcome=outcome,
        reason=reason[:2000],
    )


def attempts_interrupt(job_ids) -> None:
    JobAttempt.objects.filter(job_id__in=list(job_ids), outcome=Outcome.RUNNING).update(
        outcome=Outcome.INTERRUPTED, finished_at=timezone.now(), reason="worker stopped"
    )
