"""The attempt log: one row per provider call of a job, and the only module that writes it.

Numbers run 1, 2, 3 over the job's life (retries and heals included): an attempt takes
the next number in its own insert. A detached task's submit, its time at the provider and
its collection are phases of one attempt; the row stays open (no `finished_at`) until its
outcome is final. The transitions (engine/transitions.py) close attempts in the same
transaction as the job's change: callers outside the engine never call these directly.
"""

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from queue_app.engine import heartbeats, hot_sql, model_sql
from queue_app.engine.leases import lease_take
from queue_app.models import Job, JobAttempt, Project

Outcome = JobAttempt.Outcome
Phase = JobAttempt.Phase

# `attempt=OPEN` in a transition: the job's open attempt, whichever phase it is in (a
# check's finding, made without an attempt in hand: the poller's, a runner's).
OPEN = "open"


def attempt_begin(job: Job, token) -> JobAttempt | None:
    """This worker takes the job's lease and opens its next attempt; None when the job is
    no longer ours under `token` (healed, cleared, or taken by another worker)."""
    worker = heartbeats.process_name()
    # One transaction: a worker that dies in between leaves no lease without its attempt.
    with transaction.atomic(savepoint=False):
        if not lease_take(job.id, token, owner=worker):
            return None
        return attempt_open(job, worker)


def attempt_open(job: Job, worker: str, *, phase: Phase = Phase.SUBMIT) -> JobAttempt:
    """Open the next attempt of a job whose lease `worker` holds, numbered in its insert.
    What the history names it by (provider, owner, queued time) comes from the row in hand."""
    attempt = JobAttempt(job=job, worker=worker, task_id=job.task_id, phase=phase)
    attempt.owner_id, attempt.queued_at = job.owner_id, job.queued_at
    attempt.provider_id = job.active_provider_id or job.provider_id or _project_provider(job)
    return hot_sql.insert_attempt(attempt)


def _project_provider(job: Job):
    if "project" in job._state.fields_cache:
        return job.project.provider_id
    return Project.objects.filter(id=job.project_id).values_list("provider_id", flat=True).first()


def attempt_collect(job: Job, token) -> JobAttempt | None:
    """A collector takes the job's lease and goes on with the job's open attempt (the one
    whose task it collects) in its collect phase; a collector that died before it is
    fenced out by the lease, so its attempt is taken over. None when the job is not ours."""
    worker = heartbeats.process_name()
    with transaction.atomic(savepoint=False):
        if not lease_take(job.id, token, owner=worker):
            return None
        attempt = JobAttempt.objects.filter(job_id=job.id, finished_at__isnull=True).order_by("-number").first()
        if attempt is None:  # no open attempt (a log written before phases): one of its own
            return attempt_open(job, worker, phase=Phase.COLLECT)
        attempt.outcome, attempt.phase, attempt.worker, attempt.collecting_at = (
            Outcome.RUNNING,
            Phase.COLLECT,
            worker,
            timezone.now(),
        )
        attempt.save(update_fields=["outcome", "phase", "worker", "collecting_at"])
        return attempt


def attempt_finish(attempt_id, outcome: Outcome, reason: str = "", task_id: str = "", *, phase: Phase | None = None) -> bool:
    """How a running attempt ended, exactly once: only a row still running changes, so a
    late writer (a stale worker, a heal that got there first) changes nothing. `phase`:
    only while the attempt is in that phase."""
    fields = dict(finished_at=timezone.now(), outcome=outcome, reason=reason[:2000])
    if task_id:
        fields["task_id"] = task_id
    where = dict(id=attempt_id, outcome=Outcome.RUNNING)
    if phase is not None:
        where["phase"] = phase
    return bool(model_sql.update(JobAttempt, where, fields))


def attempt_detached(attempt_id, *, task_id: str, reason: str = "") -> bool:
    """A running attempt handed its task to the poller (or a runner's checks): its remote
    phase begins and the row stays open."""
    fields = dict(outcome=Outcome.DETACHED, phase=Phase.REMOTE, detached_at=timezone.now(), task_id=task_id, reason=reason)
    return bool(model_sql.update(JobAttempt, dict(id=attempt_id, outcome=Outcome.RUNNING), fields))


def attempt_adopted(attempt_id, *, task_id: str) -> bool:
    """A running attempt adopted a task an earlier attempt's submission had created
    (engine/reconcile.py): the row names that task, whatever it ends with."""
    return bool(model_sql.update(JobAttempt, dict(id=attempt_id, outcome=Outcome.RUNNING), dict(task_id=task_id)))


def attempt_orphan_settled(attempt_id, *, task_id: str, note: str) -> bool:
    """An ended attempt's lost task was found after its job ended (and cancelled): the row
    names it, so it is neither looked up nor adopted again (queue_service/orphans.py)."""
    row = JobAttempt.objects.filter(id=attempt_id, task_id="").values_list("reason", flat=True).first()
    if row is None:
        return False
    reason = f"{row}; {note}" if row else note
    return bool(JobAttempt.objects.filter(id=attempt_id, task_id="").update(task_id=task_id, reason=reason[:2000]))


def attempts_close_open(job_ids, *, outcome: Outcome, reason: str) -> int:
    """The open attempts of these jobs end with `outcome` (a check's finding, a cancel)."""
    return JobAttempt.objects.filter(job_id__in=list(job_ids), finished_at__isnull=True).update(
        outcome=outcome, finished_at=timezone.now(), reason=reason[:2000]
    )


def attempts_to_remote(job_ids, *, reason: str) -> int:
    """Running attempts of these (detached) jobs go back to their remote phase: the task is
    the poller's again (its collector stopped, or the task was not ready after all)."""
    return JobAttempt.objects.filter(job_id__in=list(job_ids), outcome=Outcome.RUNNING).update(
        outcome=Outcome.DETACHED, phase=Phase.REMOTE, reason=reason[:2000]
    )


def attempts_interrupt(job_ids, *, phase: Phase | None = None) -> int:
    """The running attempts of jobs whose worker is gone end as interrupted."""
    running = Q(job_id__in=list(job_ids), outcome=Outcome.RUNNING)
    if phase is not None:
        running &= Q(phase=phase)
    return JobAttempt.objects.filter(running).update(
        outcome=Outcome.INTERRUPTED, finished_at=timezone.now(), reason="worker stopped"
    )
