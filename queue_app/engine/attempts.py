"""The attempt log: one row per try at a job, and the only module that writes it.

- `attempt_begin`: a worker, collector or runner takes the job's lease and opens its
  attempt in one transaction (`attempt_open` alone: a handover's claim took the lease);
- `attempt_finish`: how it ended, exactly once: the update matches only a row still
  "running", so a late writer (a stale worker, a heal that got there first) changes nothing;
- `attempt_record`: an attempt that opens and ends in one step, for what a checker found
  without a worker (the poller's timeout, a ComfyUI check's failure);
- `attempts_interrupt`: the recovery scan ends the attempts of jobs whose worker is gone;
- `attempts_cancel`: a user cancelled processing jobs.

Numbers run on across retries (#1, #2, then #3 after a retry): `job.attempts` is the
retry budget of the current run and a retry resets it, so a run's numbers start after
the highest number of the runs before it.
"""

from django.db import transaction
from django.utils import timezone

from queue_app.engine import heartbeats, hot_sql, model_sql
from queue_app.engine.leases import lease_take
from queue_app.models import Job, JobAttempt

Outcome = JobAttempt.Outcome


def attempt_number(job: Job) -> int:
    """Attempts are numbered across the job's life: a retry (which starts `job.attempts`
    again at 0) continues after the highest number of the attempts before it."""
    earlier = hot_sql.highest_attempt_number(job.id, started_before=job.queued_at or None)
    return earlier + max(job.attempts, 1)


def attempt_begin(job: Job, token) -> JobAttempt | None:
    """This worker takes the job's lease and opens its attempt; None when the job is no
    longer ours under `token` (healed, cleared, or taken by another worker)."""
    worker = heartbeats.process_name()
    # One transaction: a worker that dies in between leaves no lease without its attempt
    # (healing records the interrupted attempt it finds), and the write lock is taken once.
    with transaction.atomic(savepoint=False):
        if not lease_take(job.id, token, owner=worker):
            return None
        return attempt_open(job, worker)


def attempt_open(job: Job, worker: str) -> JobAttempt:
    """Open the attempt of a job whose lease `worker` holds (attempt_begin, or a handover,
    whose claim took the lease in this transaction)."""
    if job.active_provider_id:
        # What the history names it by, from the row in hand (a slot's job: its
        # provider is the one whose slot it holds), and its number worked out in the
        # insert (attempt_number); otherwise save() looks them up.
        attempt = JobAttempt(job=job, worker=worker, task_id=job.task_id)
        attempt.provider_id, attempt.owner_id, attempt.queued_at = job.active_provider_id, job.owner_id, job.queued_at
        return hot_sql.insert_attempt(attempt, started_before=job.queued_at or None, run_attempts=max(job.attempts, 1))
    attempt = JobAttempt(job=job, number=attempt_number(job), worker=worker, task_id=job.task_id)
    attempt.save(force_insert=True)
    return attempt


def attempt_finish(attempt_id, outcome: Outcome, reason: str = "", task_id: str = "") -> bool:
    fields = dict(finished_at=timezone.now(), outcome=outcome, reason=reason[:2000])
    if task_id:
        fields["task_id"] = task_id
    return bool(model_sql.update(JobAttempt, dict(id=attempt_id, outcome=Outcome.RUNNING), fields))


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


def attempts_cancel(job_ids, *, reason: str, recorded_by: str) -> None:
    """A user cancelled these (processing) jobs: their open attempts end as cancelled; a
    job with none open (detached: its attempt ended when it handed over its task id) gets
    a closed one of its own, so the log says who stopped it."""
    job_ids = list(job_ids)
    now = timezone.now()
    closed = set(JobAttempt.objects.filter(job_id__in=job_ids, outcome=Outcome.RUNNING).values_list("job_id", flat=True))
    JobAttempt.objects.filter(job_id__in=closed, outcome=Outcome.RUNNING).update(
        outcome=Outcome.CANCELLED, finished_at=now, reason=reason
    )
    jobs = Job.objects.filter(id__in=[job_id for job_id in job_ids if job_id not in closed]).only(
        "id", "attempts", "task_id", "queued_at"
    )
    JobAttempt.objects.bulk_create(
        [
            JobAttempt(
                job_id=job.id,
                number=attempt_number(job),
                worker=recorded_by,
                task_id=job.task_id,
                finished_at=now,
                outcome=Outcome.CANCELLED,
                reason=reason,
            )
            for job in jobs
        ]
    )
