"""Every change of a job's status, each one compare-and-set, and with it its attempt's.

    draft ──start──▶ pending ──claim──▶ processing ──complete──▶ completed
                         ▲                 │  │
                         └──requeue/heal───┘  └──fail──▶ failed ──retry──▶ pending
    pending/processing ──cancel──▶ failed (error class "cancelled")

A transition is `filter(id=…, status=<expected>, …).update(…)` and goes on only when one
row changed; from the wrong state it is a no-op that returns False (losing a race is
normal). `attempt=` names the attempt the change ends (an id, or attempts.OPEN for a
check's finding): it is written in the same transaction, and only when the job moved,
so a fenced-out writer never touches an attempt another has taken over. Each transition
records its live event in the same transaction; one that leaves `processing` frees the
slot in the same UPDATE and wakes dispatch after commit. Nested in a caller's transaction
(the output writer's, dispatch's) they add no savepoint.
"""

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from queue_app.engine import events, failpoints, hot_sql, ledger, model_sql, project_runs
from queue_app.engine.attempts import (
    OPEN,
    Outcome,
    Phase,
    attempt_detached,
    attempt_finish,
    attempts_close_open,
    attempts_interrupt,
    attempts_to_remote,
)
from queue_app.engine.clock import db_now
from queue_app.engine.leases import lease_expiry, lease_reissue
from queue_app.models import ErrorClass, Job, Provider, Status, fence

SLOT_RELEASED = dict(active_provider=None, slot=None, lease_owner="", lease_expires_at=None, poll_claimed_until=None)
# What a start or retry clears, and what every claim resets.
FRESH_RUN = dict(error="", error_class="", not_before=None, attempts=0, finished_at=None, progress=None, poll_failures=0)
CLAIM_RESET = dict(not_before=None, run_next_at=None, progress=None, poll_failures=0)
# How an attempt ends when its job leaves processing with this error class: the outcome of
# the same name, but a job held for attention, whose submission may have been accepted.
OUTCOME_OF = {**{c: Outcome(c.value) for c in ErrorClass if c != ErrorClass.ATTENTION}, ErrorClass.ATTENTION: Outcome.AMBIGUOUS}


def _after_commit_wake(provider_ids=(), project_ids=()):
    from queue_app.engine import dispatch

    provider_ids = {pid for pid in provider_ids if pid}
    project_ids = {pid for pid in project_ids if pid}
    if provider_ids or project_ids:
        transaction.on_commit(lambda: dispatch.wake(provider_ids=provider_ids, project_ids=project_ids))


def _end_attempt(job_id, attempt, outcome: Outcome, reason: str) -> None:
    if attempt == OPEN:
        attempts_close_open([job_id], outcome=outcome, reason=reason)
    elif attempt is not None:
        attempt_finish(attempt, outcome, reason)


def jobs_to_pending(job_ids, *, from_statuses: tuple, kind: str = "job.started") -> list:
    """draft/failed → pending (start, retry). Returns the ids that moved. A retry keeps the
    task id: a job that failed locally after its provider succeeded collects that result."""
    allowed = set(from_statuses) & {Status.DRAFT, Status.FAILED}
    with transaction.atomic(savepoint=False):
        # Locked (PostgreSQL), so the ids reported are exactly the rows moved.
        rows = list(
            Job.objects.select_for_update(of=("self",))
            .filter(id__in=list(job_ids), status__in=allowed)
            .values_list("id", "project_id", "provider_id", "project__provider_id")
        )
        if not rows:
            return []
        ids = [row[0] for row in rows]
        now = timezone.now()
        # The project's run opens before the events go out: the lock order run_close uses.
        project_runs.runs_touch(project_ids={row[1] for row in rows}, at=now)
        Job.objects.filter(id__in=ids, status__in=allowed).update(status=Status.PENDING, queued_at=now, **FRESH_RUN)
        events.emit_grouped([(project_id, kind, job_id, Status.PENDING, {}) for job_id, project_id, _, _ in rows])
        _after_commit_wake(provider_ids={row[2] or row[3] for row in rows}, project_ids={row[1] for row in rows})
    return ids


CLAIM_CHUNK = 500  # jobs per claiming UPDATE


def jobs_claim(claims, *, provider_id: int, owner: str, started_at=None, provider=None) -> list[tuple]:
    """pending → processing for [(job, slot, snapshot)] under dispatch's provider lock:
    each job into its slot with its snapshot and a fresh lease token, one UPDATE per
    chunk and one event write per project. Returns [(job_id, token)] that moved, in
    order. `owner` empty: the claim waits in the broker for a worker (lease_take), under
    the longer claim lease; named: a handover, whose worker holds the lease already. Each
    claim reserves its estimate in the ledger in the same transaction (engine/ledger.py)."""
    claimed, started_at = [], started_at or timezone.now()
    provider = provider or Provider.objects.get(id=provider_id)
    ttl = settings.LEASE_TTL_SECONDS if owner else settings.CLAIM_TTL_SECONDS
    for start in range(0, len(claims), CLAIM_CHUNK):
        chunk = {job.id: (job, slot, snap) for job, slot, snap in claims[start : start + CLAIM_CHUNK]}
        tokens = {job_id: uuid.uuid4() for job_id in chunk}
        with transaction.atomic(savepoint=False):
            rows = [(job_id, provider_id, slot, tokens[job_id], snap) for job_id, (_, slot, snap) in chunk.items()]
            moved = hot_sql.claim_into_slots(rows, owner=owner, started_at=started_at, expiry=lease_expiry(ttl))
            ids = [job_id for job_id in chunk if job_id in moved]
            ledger.reserve(provider, [(chunk[i][0], chunk[i][2], tokens[i]) for i in ids])
            events.emit_grouped(
                [(chunk[i][0].project_id, "job.claimed", i, Status.PROCESSING, {"slot": chunk[i][1]}) for i in ids]
            )
        claimed += [(job_id, tokens[job_id]) for job_id in ids]
    return claimed


def lock_jobs(queryset):
    """Lock these job rows for the transaction, passing over rows another transaction
    holds (PostgreSQL SKIP LOCKED: a race lost silently; SQLite already holds the lock)."""
    return queryset.select_for_update(of=("self",), skip_locked=True)


def job_claim_unslotted(job_id, *, project_id: int, snapshot: dict, owner: str) -> uuid.UUID | None:
    """pending → processing for a job without a provider slot (ComfyUI: its runner keeps
    its own per-instance limit). Returns the lease token, or None."""
    token = uuid.uuid4()
    with transaction.atomic(savepoint=False):
        lease = dict(lease_owner=owner, lease_token=token, lease_expires_at=lease_expiry(), started_at=timezone.now())
        claimed = dict(status=Status.PROCESSING, resolved=snapshot, attempts=F("attempts") + 1, **lease, **CLAIM_RESET)
        if not Job.objects.filter(id=job_id, status=Status.PENDING).update(**claimed):
            return None
        events.emit(project_id, "job.claimed", job_id, Status.PROCESSING)
    return token


def job_detach(job_id, token, *, task_id: str, poll_seconds: float, attempt=None) -> bool:
    """processing (running) → processing (detached): the remote task id is stored before
    anything waits on it; the job keeps its slot, the lease gives way to polling, and the
    attempt's remote phase begins in the same commit (a detached job has no lease, so no
    heal would ever close it). Fenced out: the attempt ends as lost, with the task id."""
    now = db_now()  # the poller (any host) compares next_poll_at with the database's clock
    with transaction.atomic(savepoint=False):
        job = Job.objects.fenced(job_id, token).values("project_id").first()
        polled = dict(next_poll_at=now + timedelta(seconds=poll_seconds), poll_claimed_until=None, poll_failures=0)
        changed = bool(job) and Job.objects.fenced(job_id, token).update(
            task_id=task_id, task_observed_at=now, lease_owner="", lease_expires_at=None, **polled
        )
        if changed:
            events.emit(job["project_id"], "job.detached", job_id, Status.PROCESSING, {"task_id": task_id[:64]})
            failpoints.hit("after_task_id_before_attempt_closed")
            if attempt is not None:
                attempt_detached(attempt, task_id=task_id)
    if not changed and attempt is not None:
        attempt_finish(attempt, Outcome.LOST, "job taken before the task id was stored", task_id, phase=Phase.SUBMIT)
    return bool(changed)


def job_attach_task(job_id, token, *, task_id: str) -> bool:
    """A runner's job (ComfyUI) gets the remote id it chose, fenced, before the id is posted
    or anything waits on it. The lease stays with the runner."""
    with transaction.atomic(savepoint=False):
        job = Job.objects.fenced(job_id, token).values("project_id").first()
        if not job or not Job.objects.fenced(job_id, token).update(
            task_id=task_id, task_observed_at=timezone.now(), poll_failures=0
        ):
            return False
        events.emit(job["project_id"], "job.submitted", job_id, Status.PROCESSING, {"task_id": task_id[:64]})
    return True


def job_posted(job_id, token, *, attempt, task_id: str, reason: str, release_lease: bool = True) -> bool:
    """A runner's submission is at the remote instance: its attempt's remote phase begins
    and (`release_lease`) the lease gives way to the runner's checks."""
    fields = dict(lease_expires_at=None, lease_owner="", poll_failures=0) if release_lease else dict(poll_failures=0)
    with transaction.atomic(savepoint=False):
        if not Job.objects.fenced(job_id, token).update(**fields):
            return False
        attempt_detached(attempt, task_id=task_id, reason=reason)
    return True


def job_given_back(job_id, token, *, attempt, outcome: Outcome, reason: str, count_failure: bool = True) -> bool:
    """A runner's submission that could not finish ends its attempt; the job stays in
    flight with an expired lease, for the runner's next check to resolve."""
    fields = dict(lease_expires_at=Now(), lease_owner="")
    if count_failure:
        fields["poll_failures"] = F("poll_failures") + 1
    with transaction.atomic(savepoint=False):
        if not Job.objects.fenced(job_id, token).update(**fields):
            return False
        attempt_finish(attempt, outcome, reason)
    return True


def job_hand_out_again(job_id, token, *, hold: timedelta, if_over: bool = False, forgotten: str = "") -> uuid.UUID | None:
    """A runner's work handed out again under a fresh lease (leases.lease_reissue): a
    submission whose worker is gone ends interrupted; a collection's attempt waits at the
    remote again for the next collector. `forgotten`: the instance lost the prompt, which
    is posted again as the job's next attempt (its open one ends lost with this reason)."""
    with transaction.atomic(savepoint=False):
        new_token = lease_reissue(job_id, token, hold=hold, if_over=if_over)
        if new_token is None:
            return None
        if forgotten:
            attempts_close_open([job_id], outcome=Outcome.LOST, reason=forgotten)
            Job.objects.fenced(job_id, new_token).update(attempts=F("attempts") + 1, poll_failures=0)
        else:
            attempts_interrupt([job_id], phase=Phase.SUBMIT)
            attempts_to_remote([job_id], reason="its collector stopped")
    return new_token


def job_back_to_polling(job_id, token, *, reason: str) -> bool:
    """processing (collecting) → processing (detached), checked again now: the task was
    not ready to collect after all. The collector's attempt waits at the provider again."""
    # A value, not Now(): the poller's claim compares next_poll_at for equality, and SQLite
    # stores Now() at a precision a value read back does not match.
    now = db_now()
    with transaction.atomic(savepoint=False):
        if not Job.objects.fenced(job_id, token).update(
            poll_claimed_until=None, next_poll_at=now, lease_expires_at=None, lease_owner=""
        ):
            return False
        attempts_to_remote([job_id], reason=reason)
    return True


def jobs_back_to_polling(job_ids, *, gone: Q) -> list:
    """Detached jobs whose worker (an adopting retry, a collector) is gone, still matching
    `gone` under a row lock: the lease goes, the poller checks them at once, and their
    attempts wait at the provider again. Returns the ids moved."""
    now = db_now()  # a value, as job_back_to_polling says
    with transaction.atomic(savepoint=False):
        ids = list(lock_jobs(Job.objects.filter(gone, id__in=list(job_ids))).values_list("id", flat=True))
        if ids:
            Job.objects.filter(gone, id__in=ids).update(
                lease_expires_at=None, lease_owner="", next_poll_at=now, poll_claimed_until=None
            )
            attempts_to_remote(ids, reason="its worker stopped; the poller checks the task again")
    return ids


def _leave_processing(
    job_id, token, *, new_status: str, kind: str, fields: dict, payload: dict, ending, held=None, cost=None
) -> bool:
    """`ending`: (attempt, outcome, reason) for the attempt this ends, and the claim's ledger
    line with it (`cost`: the provider's figure). `held`: the job's row, locked under `token`."""
    with transaction.atomic(savepoint=False):
        if held is not None:
            job = {"project_id": held.project_id, "active_provider_id": held.active_provider_id, "task_id": held.task_id}
        else:
            job = Job.objects.fenced(job_id, token).values("project_id", "active_provider_id", "task_id").first()
        if not job or not model_sql.update(Job, fence(job_id, token), dict(status=new_status, **SLOT_RELEASED, **fields)):
            return False
        events.emit(job["project_id"], kind, job_id, new_status, payload)
        ledger.end_left(job_id, fields, submitted=bool(job["task_id"]), reported=cost)
        _end_attempt(job_id, *ending)
        # A freed provider slot wakes its provider; only a job without one (a runner's)
        # wakes its project (reading the project's pending work cost every completion).
        if job["active_provider_id"]:
            _after_commit_wake(provider_ids={job["active_provider_id"]})
        else:
            _after_commit_wake(project_ids={job["project_id"]})
    return True


def job_complete(job_id, token, *, held=None, attempt=None, reason: str = "", cost=None) -> bool:
    """processing → completed; frees the slot and ends `attempt` completed. Call inside the
    output writer's transaction so the album items and the completion commit together.
    `cost`: what the provider reported it charged (settled instead of the estimate)."""
    fields = dict(error="", error_class="", finished_at=timezone.now(), progress=1.0, lease_token=None)
    ending = (attempt, Outcome.COMPLETED, reason)
    done = dict(new_status=Status.COMPLETED, kind="job.completed", fields=fields, payload={}, ending=ending)
    return _leave_processing(job_id, token, **done, held=held, cost=cost)


def job_fail(
    job_id, token, *, reason: str, error_class: ErrorClass, attempt=None, outcome=None, keep_task_id: bool = True
) -> bool:
    """processing → failed with a readable reason; frees the slot and ends `attempt` with
    `outcome` (by default the error class's). The task id stays unless the remote task is
    known dead, so a retry can collect an existing result."""
    fields = dict(error=reason[:2000], error_class=error_class, finished_at=timezone.now(), lease_token=None)
    if not keep_task_id:
        fields.update(task_id="", task_observed_at=None, next_poll_at=None)
    payload = {"error": reason[:300], "error_class": error_class}
    ending = (attempt, outcome or OUTCOME_OF[error_class], reason)
    return _leave_processing(
        job_id, token, new_status=Status.FAILED, kind="job.failed", fields=fields, payload=payload, ending=ending
    )


def job_requeue(
    job_id, token, *, reason: str, error_class, attempt=None, outcome=None, delay=0, refund_attempt=False, keep_task_id=False
) -> bool:
    """processing → pending, tried again after `delay` seconds; ends `attempt` like job_fail.
    A refunded try does not count against the job (a rate limit: the provider's cool-down
    paid for it). `keep_task_id`: the remote task's result is still to be collected."""
    # On the database's clock, which the claim compares it with (engine/clock.py).
    not_before = Now() + timedelta(seconds=delay) if delay > 0 else None
    fields = dict(error=reason[:2000], error_class=error_class, not_before=not_before, lease_token=None, next_poll_at=None)
    if not keep_task_id:
        fields.update(task_id="", task_observed_at=None)
    if refund_attempt:
        fields["attempts"] = F("attempts") - 1
    ending = (attempt, outcome or OUTCOME_OF[error_class], reason)
    payload = {"error": reason[:300]}
    return _leave_processing(
        job_id, token, new_status=Status.PENDING, kind="job.requeued", fields=fields, payload=payload, ending=ending
    )


def job_lost(attempt, *, reason: str, task_id: str = "") -> bool:
    """The job was taken from this worker (healed, cancelled, handed out again) before it
    could write: its attempt ends as lost, unless whoever took the job ended it already.
    Only a submit phase: a collection's attempt is the poller's again once fenced out."""
    return attempt_finish(attempt, Outcome.LOST, reason, task_id, phase=Phase.SUBMIT)


def _lease_gone(dead_owners=()) -> Q:
    """A running job's lease is over: expired, never set, or held by a process known dead."""
    lease_gone = Q(lease_expires_at__lt=Now()) | Q(lease_expires_at__isnull=True)
    return lease_gone | Q(lease_owner__in=list(dead_owners)) if dead_owners else lease_gone


def jobs_heal(job_ids, *, reason: str, dead_owners=()) -> list:
    """processing (running, its lease over or its owner dead) → pending, as a batch. Only
    jobs without a remote task id: a detached job keeps its slot and is polled."""
    fields = dict(error=reason, error_class=ErrorClass.LOCAL)
    return _jobs_leave_stalled(job_ids, dead_owners, Status.PENDING, "job.healed", fields, {"reason": reason})


def jobs_fail_stalled(job_ids, *, reason: str, dead_owners=()) -> list:
    """Stalled jobs whose tries are used up → failed: a job that keeps losing its worker."""
    fields = dict(error=reason, error_class=ErrorClass.LOCAL, finished_at=timezone.now())
    return _jobs_leave_stalled(job_ids, dead_owners, Status.FAILED, "job.failed", fields, {"error": reason})


def jobs_hold_stalled(job_ids, *, reason: str, dead_owners=()) -> list:
    """Stalled jobs that may have been submitted → failed, held for attention: the provider
    record chose not to risk paying twice (engine/ambiguous.py)."""
    fields = dict(error=reason, error_class=ErrorClass.ATTENTION, finished_at=timezone.now())
    return _jobs_leave_stalled(job_ids, dead_owners, Status.FAILED, "job.failed", fields, {"error": reason})


def _jobs_leave_stalled(job_ids, dead_owners, new_status: str, kind: str, fields: dict, payload: dict) -> list:
    """Running jobs whose worker is gone leave processing in one short transaction: the rows
    still stalled are locked (a worker renewing one now holds it and is passed over), one
    UPDATE moves exactly those, their attempts end interrupted. Returns the ids moved."""
    stalled = Q(status=Status.PROCESSING, task_id="") & _lease_gone(dead_owners)
    with transaction.atomic(savepoint=False):
        rows = list(
            lock_jobs(Job.objects.filter(stalled, id__in=list(job_ids))).values_list("id", "project_id", "active_provider_id")
        )
        if not rows:
            return []
        ids = [row[0] for row in rows]
        Job.objects.filter(stalled, id__in=ids).update(status=new_status, **SLOT_RELEASED, lease_token=None, **fields)
        ledger.end_stalled(ids)
        attempts_interrupt(ids)
        events.emit_grouped([(project_id, kind, job_id, new_status, payload) for job_id, project_id, _ in rows])
        _after_commit_wake(provider_ids={row[2] for row in rows}, project_ids={row[1] for row in rows if not row[2]})
    return ids


CANCELLED_REASON = "cancelled"


def jobs_cancel(job_ids, *, by: str = "user") -> list[dict]:
    """pending/processing → failed, error class "cancelled", at once. A processing job frees
    its slot and loses its lease token in the same UPDATE, so its worker is fenced out
    (no file, no album item, no retry), and its open attempt ends cancelled. The task id
    stays, as after a timeout. Returns the moved rows (id, project_id, project__kind,
    status before, active_provider_id, task_id, resolved): the caller cancels their remote
    tasks after commit, never inside this transaction."""
    cancellable = (Status.PENDING, Status.PROCESSING)
    with transaction.atomic(savepoint=False):
        rows = list(
            Job.objects.select_for_update(of=("self",))
            .filter(id__in=list(job_ids), status__in=cancellable)
            .values("id", "project_id", "project__kind", "status", "active_provider_id", "task_id", "resolved")
        )
        if not rows:
            return []
        freed = [row for row in rows if row["status"] == Status.PROCESSING]
        ledger.end_cancelled(freed)
        attempts_close_open([row["id"] for row in freed], outcome=Outcome.CANCELLED, reason=f"cancelled by {by}")
        ended = dict(lease_token=None, finished_at=timezone.now(), not_before=None, progress=None, next_poll_at=None)
        Job.objects.filter(id__in=[row["id"] for row in rows], status__in=cancellable).update(
            status=Status.FAILED, error=CANCELLED_REASON, error_class=ErrorClass.CANCELLED, **SLOT_RELEASED, **ended
        )
        payload = {"error": CANCELLED_REASON, "error_class": ErrorClass.CANCELLED}
        events.emit_grouped([(row["project_id"], "job.cancelled", row["id"], Status.FAILED, payload) for row in rows])
        # Freed slots are refilled at once: a provider's, or a runner's (ComfyUI) place.
        _after_commit_wake(
            provider_ids={row["active_provider_id"] for row in freed},
            project_ids={row["project_id"] for row in freed if not row["active_provider_id"]},
        )
    return rows
