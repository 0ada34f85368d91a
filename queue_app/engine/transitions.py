"""Every change of a job's status, each one compare-and-set.

    draft ──start──▶ pending ──claim──▶ processing ──complete──▶ completed
                         ▲                 │  │
                         └──requeue/heal───┘  └──fail──▶ failed ──retry──▶ pending
    pending/processing ──cancel──▶ failed (error_class "cancelled")

A transition is `filter(id=…, status=<expected>, …).update(…)` and goes on only when
one row changed. From the wrong state it is a no-op that returns False — never an
exception, never a partial write: losing a race is a normal outcome. The batch forms
(jobs_claim, jobs_heal, jobs_fail_stalled, jobs_hold_stalled) are the same compare-and-set
over a set of rows in one statement — the rows that no longer match are left out and
reported as not moved — so the recovery scan's cost follows batches, not jobs. Transitions that
leave `processing` free the slot in the same UPDATE and wake dispatch after commit.
Each one records its live event in the same transaction. Nested in a caller's
transaction (the output writer's, dispatch's) they add no savepoint: a transition that
raises rolls the caller back too, which is what every caller wants.

Long because: the state machine is read in one place (ARCHITECTURE, invariant 2), its
batch forms beside the single ones.
"""

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from queue_app.engine import events, failpoints, model_sql, project_runs
from queue_app.engine.attempts import attempt_finish, attempts_cancel, attempts_interrupt
from queue_app.engine.clock import db_now
from queue_app.engine.leases import lease_expiry
from queue_app.models import ErrorClass, Job, JobAttempt, Status, fence

SLOT_RELEASED = dict(active_provider=None, slot=None, lease_owner="", lease_expires_at=None, poll_claimed_until=None)


def _after_commit_wake(provider_ids=(), project_ids=()):
    from queue_app.engine import dispatch

    provider_ids = {pid for pid in provider_ids if pid}
    project_ids = {pid for pid in project_ids if pid}
    if provider_ids or project_ids:
        transaction.on_commit(lambda: dispatch.wake(provider_ids=provider_ids, project_ids=project_ids))


def jobs_to_pending(job_ids, *, from_statuses: tuple, kind: str = "job.started") -> list:
    """draft/failed → pending (start, retry). Returns the ids that moved.

    A retry keeps the task id: a job that failed locally after its provider succeeded
    collects the existing result instead of paying for a new one.
    """
    allowed = set(from_statuses) & {Status.DRAFT, Status.FAILED}
    with transaction.atomic(savepoint=False):
        # Lock the candidates (PostgreSQL; SQLite's IMMEDIATE transaction already holds
        # the write lock) so the ids we report are exactly the rows we moved.
        rows = list(
            Job.objects.select_for_update(of=("self",))
            .filter(id__in=list(job_ids), status__in=allowed)
            .values_list("id", "project_id", "provider_id", "project__provider_id")
        )
        if not rows:
            return []
        ids = [row[0] for row in rows]
        now = timezone.now()
        # Open (or note the start on) the project's run before the events are emitted: the
        # lock order runs.run_close uses too. queued_at == the run's opened_at.
        project_runs.runs_touch(project_ids={row[1] for row in rows}, at=now)
        Job.objects.filter(id__in=ids, status__in=allowed).update(
            status=Status.PENDING,
            error="",
            error_class="",
            not_before=None,
            attempts=0,
            queued_at=now,
            finished_at=None,
            progress=None,
            poll_failures=0,
        )
        events.emit_grouped([(project_id, kind, job_id, Status.PENDING, {}) for job_id, project_id, _, _ in rows])
        _after_commit_wake(
            provider_ids={row[2] or row[3] for row in rows},
            project_ids={row[1] for row in rows},
        )
    return ids


CLAIM_CHUNK = 500  # jobs per claiming UPDATE: one CASE arm per job and field


def jobs_claim(claims, *, provider_id: int, owner: str, started_at=None) -> list[tuple]:
    """pending → processing for many jobs at once: `claims` is [(job, slot, snapshot)]. Each job gets
    its own slot, snapshot and lease token in one UPDATE per chunk, one event write per
    project. Call inside dispatch's transaction. Returns [(job_id, token)] that moved, in
    the order given; a job no longer pending (or locked by a canceller) is left out.

    `owner` empty: the claim waits in the broker for a worker to take it (lease_take),
    under the longer claim lease. `owner` named: that worker runs it and the lease is its
    own already (a handover, which opens the attempt in the same transaction)."""
    claimed, started_at = [], started_at or timezone.now()
    for start in range(0, len(claims), CLAIM_CHUNK):
        chunk = claims[start : start + CLAIM_CHUNK]
        claimed += _jobs_claim_chunk(chunk, provider_id=provider_id, owner=owner, started_at=started_at)
    return claimed


def _jobs_claim_chunk(claims, *, provider_id: int, owner: str, started_at) -> list[tuple]:
    if not claims:
        return []
    by_id = {job.id: (job, slot, snap) for job, slot, snap in claims}
    tokens = {job_id: uuid.uuid4() for job_id in by_id}
    with transaction.atomic(savepoint=False):
        moved = _claim_into_slots(
            [(job_id, provider_id, slot, tokens[job_id], snap) for job_id, (_, slot, snap) in by_id.items()],
            owner=owner,
            started_at=started_at,
        )
        ids = [job_id for job_id in by_id if job_id in moved]
        events.emit_grouped(
            [
                (by_id[job_id][0].project_id, "job.claimed", job_id, Status.PROCESSING, {"slot": by_id[job_id][1]})
                for job_id in ids
            ]
        )
    return [(job_id, tokens[job_id]) for job_id in ids]


def as_claimed(job: Job, slot: int, snap: dict, *, provider, token, started_at, owner: str = "") -> Job:
    """The pending `job` in hand as _claim_into_slots left its row (for a caller that goes
    on with it in the claim's transaction), but for its lease's expiry, which is the
    database's clock and nobody in that transaction reads."""
    job.status, job.active_provider, job.slot, job.lease_token, job.resolved = Status.PROCESSING, provider, slot, token, snap
    job.lease_owner, job.attempts, job.started_at, job.not_before, job.progress = owner, job.attempts + 1, started_at, None, None
    job.poll_failures, job.next_poll_at, job.poll_claimed_until = 0, None, None
    return job


def _claim_into_slots(rows, *, owner: str, started_at) -> set:
    """The claim's compare-and-set for many jobs in one statement, UPDATE … FROM (VALUES …)
    … RETURNING (PostgreSQL and SQLite alike): each row (id, provider, slot, lease token,
    snapshot) moves only if its job is still pending and due; status, provider and slot
    change together, as the slot constraint asks. Returns the ids that moved. (Django's
    CASE/WHEN form spent more time building expressions than the database spent on the
    claim, and needed a second UPDATE for the shared fields.)"""
    table = Job._meta.db_table
    fields = [Job._meta.get_field(name) for name in ("id", "active_provider", "slot", "lease_token", "resolved")]
    casts = ("::uuid", "::bigint", "::integer", "::uuid", "::jsonb") if connection.vendor == "postgresql" else ("",) * 5
    row = "(" + ", ".join(f"%s{cast}" for cast in casts) + ")"
    params = [field.get_db_prep_value(value, connection) for values in rows for field, value in zip(fields, values, strict=True)]
    # Until a worker takes it (lease_take), the claim waits in the broker: a longer
    # lease, so a busy broker does not get its claims healed away.
    ttl = settings.LEASE_TTL_SECONDS if owner else settings.CLAIM_TTL_SECONDS
    expiry_sql, expiry_params = _compiled(lease_expiry(ttl))
    now_sql, now_params = _compiled(Now())
    started_at = Job._meta.get_field("started_at").get_db_prep_value(started_at, connection)
    with model_sql.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET status = %s, active_provider_id = v.column2, slot = v.column3, "
            f"lease_token = v.column4, resolved = v.column5, lease_owner = %s, lease_expires_at = {expiry_sql}, "
            "attempts = attempts + 1, started_at = %s, not_before = NULL, progress = NULL, poll_failures = 0, "
            "next_poll_at = NULL, poll_claimed_until = NULL "
            f"FROM (VALUES {', '.join([row] * len(rows))}) AS v WHERE {table}.id = v.column1 AND {table}.status = %s "
            f"AND ({table}.not_before IS NULL OR {table}.not_before <= {now_sql}) RETURNING {table}.id",
            [Status.PROCESSING, owner, *expiry_params, started_at, *params, Status.PENDING, *now_params],
        )
        return {Job._meta.pk.to_python(job_id) for (job_id,) in cursor.fetchall()}


def _compiled(expression) -> tuple[str, list]:
    """A Django expression as SQL and parameters for this database (Now() differs)."""
    query = Job.objects.all().query
    sql, params = query.get_compiler(connection=connection).compile(expression.resolve_expression(query))
    return sql, list(params)


def lock_jobs(queryset):
    """Lock these job rows for the rest of the transaction, passing over rows another
    transaction holds (PostgreSQL: FOR UPDATE SKIP LOCKED). A skipped row is a race lost
    silently; the next wake-up or heal sees it again. SQLite's IMMEDIATE transaction
    already holds the only write lock, so there it is a plain read."""
    return queryset.select_for_update(of=("self",), skip_locked=True)


def job_claim_unslotted(job_id, *, project_id: int, snapshot: dict, owner: str) -> uuid.UUID | None:
    """pending → processing for a job that runs without a provider slot (ComfyUI: its
    runner keeps its own per-instance limit)."""
    token = uuid.uuid4()
    with transaction.atomic(savepoint=False):
        changed = Job.objects.filter(id=job_id, status=Status.PENDING).update(
            status=Status.PROCESSING,
            resolved=snapshot,
            lease_owner=owner,
            lease_token=token,
            lease_expires_at=lease_expiry(),
            attempts=F("attempts") + 1,
            started_at=timezone.now(),
            not_before=None,
            progress=None,
            poll_failures=0,
        )
        if not changed:
            return None
        events.emit(project_id, "job.claimed", job_id, Status.PROCESSING)
    return token


def job_detach(job_id, token, *, task_id: str, poll_seconds: float, attempt_id=None) -> bool:
    """processing (running) → processing (detached): store the remote task id before
    anything waits on it. The job keeps its slot; the lease gives way to polling.

    The worker's attempt `attempt_id` ends as detached in the same commit: a detached job
    has no lease, so no heal ever looks at it again, and an attempt left open by a worker
    killed between the two writes stayed "running" after its job had finished."""
    now = db_now()  # the poller (any host) compares next_poll_at with the database's clock
    with transaction.atomic(savepoint=False):
        job = Job.objects.fenced(job_id, token).values("project_id").first()
        if not job:
            return False
        changed = Job.objects.fenced(job_id, token).update(
            task_id=task_id,
            task_observed_at=now,
            next_poll_at=now + timedelta(seconds=poll_seconds),
            lease_owner="",
            lease_expires_at=None,
            poll_claimed_until=None,
            poll_failures=0,
        )
        if changed:
            events.emit(job["project_id"], "job.detached", job_id, Status.PROCESSING, {"task_id": task_id[:64]})
            failpoints.hit("after_task_id_before_attempt_closed")
            if attempt_id is not None:
                attempt_finish(attempt_id, JobAttempt.Outcome.DETACHED, task_id=task_id)
    return bool(changed)


def _leave_processing(job_id, token, *, new_status: str, kind: str, fields: dict, payload: dict, held=None) -> bool:
    """`held` is the job's row, locked by the caller in this transaction under `token`
    (the output writer's): its project and provider are current, so they are not read again."""
    with transaction.atomic(savepoint=False):
        if held is not None:
            job = {"project_id": held.project_id, "active_provider_id": held.active_provider_id}
        else:
            job = Job.objects.fenced(job_id, token).values("project_id", "active_provider_id").first()
        if not job:
            return False
        if not model_sql.update(Job, fence(job_id, token), dict(status=new_status, **SLOT_RELEASED, **fields)):
            return False
        events.emit(job["project_id"], kind, job_id, new_status, payload)
        # The freed slot is the provider's; only a job without one (a runner's: ComfyUI)
        # wakes its project. Looking up the project's other pending work here cost every
        # completion a query and found nothing a freed provider slot could take.
        if job["active_provider_id"]:
            _after_commit_wake(provider_ids={job["active_provider_id"]})
        else:
            _after_commit_wake(project_ids={job["project_id"]})
    return True


def job_complete(job_id, token, *, held=None) -> bool:
    """processing → completed; frees the slot. Call inside the output writer's transaction
    so the album items and the completion commit together (`held`: its locked row)."""
    return _leave_processing(
        job_id,
        token,
        new_status=Status.COMPLETED,
        kind="job.completed",
        fields=dict(error="", error_class="", finished_at=timezone.now(), progress=1.0, lease_token=None),
        payload={},
        held=held,
    )


def job_fail(job_id, token, *, reason: str, error_class: str, keep_task_id: bool = True) -> bool:
    """processing → failed with a readable reason; frees the slot. The task id stays
    unless the remote task is known dead, so a retry can collect an existing result."""
    fields = dict(error=reason[:2000], error_class=error_class, finished_at=timezone.now(), lease_token=None)
    if not keep_task_id:
        fields.update(task_id="", task_observed_at=None, next_poll_at=None)
    return _leave_processing(
        job_id,
        token,
        new_status=Status.FAILED,
        kind="job.failed",
        fields=fields,
        payload={"error": reason[:300], "error_class": error_class},
    )


def job_requeue(
    job_id,
    token,
    *,
    reason: str,
    error_class: str,
    delay: float = 0,
    refund_attempt: bool = False,
    keep_task_id: bool = False,
) -> bool:
    """processing → pending, to be tried again after `delay` seconds (backoff). A
    rate-limited attempt is refunded: the provider's cool-down, not the job, paid for it.
    `keep_task_id`: the remote task finished and its result is still to be collected (a
    full media disk): the next try adopts it instead of paying again."""
    fields = dict(
        error=reason[:2000],
        error_class=error_class,
        # The database's clock, which the claim compares it with (engine/clock.py).
        not_before=Now() + timedelta(seconds=delay) if delay > 0 else None,
        lease_token=None,
        next_poll_at=None,
    )
    if not keep_task_id:
        fields.update(task_id="", task_observed_at=None)
    if refund_attempt:
        fields["attempts"] = F("attempts") - 1
    return _leave_processing(
        job_id, token, new_status=Status.PENDING, kind="job.requeued", fields=fields, payload={"error": reason[:300]}
    )


def _lease_gone(dead_owners=()) -> Q:
    """A running job's lease is over: expired, never set, or held by a process known dead."""
    lease_gone = Q(lease_expires_at__lt=Now()) | Q(lease_expires_at__isnull=True)
    return lease_gone | Q(lease_owner__in=list(dead_owners)) if dead_owners else lease_gone


def jobs_heal(job_ids, *, reason: str, dead_owners=()) -> list:
    """processing (running, lease expired, or its owner known dead) → pending, for a batch
    (the recovery scan, healing): one statement per step, not one compare-and-set per job.
    Only jobs without a remote task id: a detached job keeps its slot and is polled
    instead. Returns the ids that moved."""
    return _jobs_leave_stalled(
        job_ids,
        lease_gone=_lease_gone(dead_owners),
        new_status=Status.PENDING,
        kind="job.healed",
        fields=dict(error=reason, error_class="local"),
        payload={"reason": reason},
    )


def jobs_fail_stalled(job_ids, *, reason: str, dead_owners=()) -> list:
    return _jobs_leave_stalled(
        job_ids,
        lease_gone=_lease_gone(dead_owners),
        new_status=Status.FAILED,
        kind="job.failed",
        fields=dict(error=reason, error_class="local", finished_at=timezone.now()),
        payload={"error": reason},
    )


def jobs_hold_stalled(job_ids, *, reason: str, dead_owners=()) -> list:
    return _jobs_leave_stalled(
        job_ids,
        lease_gone=_lease_gone(dead_owners),
        new_status=Status.FAILED,
        kind="job.failed",
        fields=dict(error=reason, error_class=ErrorClass.ATTENTION, finished_at=timezone.now()),
        payload={"error": reason},
    )


def _jobs_leave_stalled(job_ids, *, lease_gone: Q, new_status: str, kind: str, fields: dict, payload: dict) -> list:
    """Running jobs (no task id) whose worker is gone leave processing, as one short
    transaction: the rows still matching `lease_gone` are locked (a worker renewing one
    right now holds it and is passed over), then one UPDATE moves exactly those — so a
    worker that renewed before the lock keeps its job, and one that tries after finds
    its token gone (fenced). The interrupted attempts close, one event per job and one
    wake-up per provider go out, all in the same transaction. Returns the ids moved."""
    stalled = Q(status=Status.PROCESSING, task_id="") & lease_gone
    with transaction.atomic(savepoint=False):
        rows = list(
            lock_jobs(Job.objects.filter(stalled, id__in=list(job_ids))).values_list("id", "project_id", "active_provider_id")
        )
        if not rows:
            return []
        ids = [row[0] for row in rows]
        Job.objects.filter(stalled, id__in=ids).update(status=new_status, **SLOT_RELEASED, lease_token=None, **fields)
        attempts_interrupt(ids)
        events.emit_grouped([(project_id, kind, job_id, new_status, payload) for job_id, project_id, _ in rows])
        # A freed provider slot wakes its provider; only a job without one (a runner's)
        # wakes its project — a project wake reads all its pending work, per batch.
        _after_commit_wake(provider_ids={row[2] for row in rows}, project_ids={row[1] for row in rows if not row[2]})
    return ids


def job_attach_task(job_id, token, *, task_id: str) -> bool:
    """processing → processing with a remote task id, for runner-driven jobs (ComfyUI):
    the id the runner chose is stored, fenced by the lease token, before it is posted or
    anything waits on it. The lease stays with the runner (no detached polling)."""
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        job = Job.objects.fenced(job_id, token).values("project_id").first()
        if not job:
            return False
        changed = Job.objects.fenced(job_id, token).update(task_id=task_id, task_observed_at=now, poll_failures=0)
        if changed:
            events.emit(job["project_id"], "job.submitted", job_id, Status.PROCESSING, {"task_id": task_id[:64]})
    return bool(changed)


CANCELLED_REASON = "cancelled"


def jobs_cancel(job_ids, *, by: str = "user") -> list[dict]:
    """pending/processing → failed with reason "cancelled" (error_class "cancelled"), at once.

    A processing job frees its slot in the same UPDATE and its lease token goes, so the
    worker still running it is fenced out: its result writes no file, no album item, and
    no retry. Open attempts end as cancelled. The task id stays, as after a timeout: a
    retry looks at the (cancelled) task first and submits anew once it finds it dead —
    or collects it, if the provider finished it anyway.

    Returns the moved jobs as {id, project_id, project__kind, status (before),
    active_provider_id, task_id, resolved}, so the caller can cancel their remote tasks
    after commit — never here, inside the transaction.
    """
    cancellable = (Status.PENDING, Status.PROCESSING)
    with transaction.atomic(savepoint=False):
        rows = list(
            Job.objects.select_for_update(of=("self",))
            .filter(id__in=list(job_ids), status__in=cancellable)
            .values("id", "project_id", "project__kind", "status", "active_provider_id", "task_id", "resolved")
        )
        if not rows:
            return []
        ids = [row["id"] for row in rows]
        processing = [row["id"] for row in rows if row["status"] == Status.PROCESSING]
        attempts_cancel(processing, reason=f"cancelled by {by}", recorded_by=by)
        Job.objects.filter(id__in=ids, status__in=cancellable).update(
            status=Status.FAILED,
            **SLOT_RELEASED,
            lease_token=None,
            error=CANCELLED_REASON,
            error_class=ErrorClass.CANCELLED,
            finished_at=timezone.now(),
            not_before=None,
            progress=None,
            next_poll_at=None,
        )
        payload = {"error": CANCELLED_REASON, "error_class": ErrorClass.CANCELLED}
        events.emit_grouped([(row["project_id"], "job.cancelled", row["id"], Status.FAILED, payload) for row in rows])
        # Freed slots are refilled at once: a provider's, or a runner's (ComfyUI) place.
        freed = [row for row in rows if row["status"] == Status.PROCESSING]
        _after_commit_wake(
            provider_ids={row["active_provider_id"] for row in freed},
            project_ids={row["project_id"] for row in freed if not row["active_provider_id"]},
        )
    return rows
