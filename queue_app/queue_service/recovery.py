"""The recovery scan (on every start) and healing (on the queue service's timer).

Both act only on work whose owner is gone: an expired lease, or an owner known dead (the
kernel on this host; heartbeats across hosts, only for what calls no provider), so they
are safe beside other hosts' workers, even ones cut off inside a provider call. A dead
worker cluster's untaken hand-offs (its local queue) are released at once; the lease token
fences out any copy a live cluster still has.

recover() returns running jobs whose worker is gone to pending (recovery by retry, their
attempts interrupted), polls detached jobs at once with their timeout window restarted,
lets runners (ComfyUI) adopt their work, and dispatches every provider with work. It walks
the tables in id-ordered batches, each moved by set-based statements in its own short
transaction, so time follows batches, not jobs, and memory stays flat.
"""

import logging
from datetime import timedelta

from django.db.models import Q
from django.db.models.functions import Now

from queue_app.engine import ambiguous, backoff, dispatch, heartbeats, runner_registry, transitions
from queue_app.engine.attempts import Outcome
from queue_app.engine.clock import db_now
from queue_app.models import Heartbeat, Job, JobAttempt, Status

log = logging.getLogger(__name__)

# Jobs per statement: each batch is its own short transaction, so a scan of 100,000 jobs
# neither holds locks for long nor loads the table (memory stays flat).
BATCH = 2000
HEAL_REASON = "worker stopped while running the job; retried"


def _batches(queryset):
    """Yield lists of (id, …) rows in primary-key order without loading the table."""
    last = None
    while True:
        page = queryset.order_by("id")
        if last is not None:
            page = page.filter(id__gt=last)
        rows = list(page[:BATCH])
        if not rows:
            return
        yield rows
        last = rows[-1][0]


def heal_stalled(rows, *, dead_owners=()) -> int:
    """Stalled running jobs, rows of (id, owner, attempts, max_attempts, expiry, options,
    kind), leave processing by what each one's record says, one set-based transition per
    outcome: back to pending (recovery by retry), failed when its attempts are used up,
    or held for attention when its submission may have been accepted. Each transition
    re-checks the lease under a row lock, so a job whose worker renewed since the rows
    were read is left alone. Returns how many moved."""
    hold = held_for_attention(rows)
    retry, held, give_up = [], [], {}
    for job_id, _, attempts, max_attempts, *_ in rows:
        if job_id in hold:
            held.append(job_id)
        elif attempts >= (max_attempts or 1):
            give_up.setdefault(attempts, []).append(job_id)
        else:
            retry.append(job_id)
    moved = len(transitions.jobs_heal(retry, reason=HEAL_REASON, dead_owners=dead_owners)) if retry else 0
    if held:
        moved += len(transitions.jobs_hold_stalled(held, reason=ambiguous.HOLD_REASON, dead_owners=dead_owners))
    for attempts, job_ids in give_up.items():
        reason = backoff.give_up_reason(attempts, "the worker stopped while running the job")
        moved += len(transitions.jobs_fail_stalled(job_ids, reason=reason, dead_owners=dead_owners))
    return moved


def held_for_attention(rows) -> set:
    """Of stalled rows (id, owner, attempts, max_attempts, expiry, options, kind), the jobs
    to hold rather than retry: the provider record holds ambiguous submissions, and a
    worker had begun the job (an attempt is open), so its submission may have been sent.
    A family that looks submissions up again (engine/reconcile.py) is retried instead."""
    candidates = [row[0] for row in rows if ambiguous.holds(row[5], row[6])]
    if not candidates:
        return set()
    families = Job.objects.filter(id__in=candidates).values_list("id", "active_provider__family")
    candidates = [job_id for job_id, family in families if not ambiguous.reconciled(family or "")]
    return set(JobAttempt.objects.filter(job_id__in=candidates, outcome=Outcome.RUNNING).values_list("job_id", flat=True))


def heal(*, include_dead_owners: bool = True) -> int:
    """Heal running jobs whose lease expired (or whose owner died on this host)."""
    with dispatch.deferred_wakes():
        return _heal(include_dead_owners=include_dead_owners)


def heal_dead_owners() -> int:
    """The dead-owner half of healing, on its own faster cadence (DEAD_OWNER_SECONDS): a
    killed worker's or cluster's jobs go back to a slot within a fraction of a second, not
    at the next heal (which still covers them, and expired leases). It reads the distinct
    owners of live leases and asks the kernel or the heartbeats about each — no walk over
    every running job."""
    with dispatch.deferred_wakes():
        released = release_dead_clusters_handoffs()
        healed = _heal_dead_owners(db_now())
        if released:
            healed += _heal(include_dead_owners=False)  # the claims just released have lapsed
        return healed


def release_dead_clusters_handoffs() -> int:
    """A worker cluster died: hand-offs no worker has taken yet may sit in its local queue
    and would wait for their lease (claims) or hold (collections) to run out. Release them
    all now — the lapsed claims are healed below, the collections polled again at once —
    and mark the dead cluster released so this happens once per death."""
    dead = heartbeats.dead_clusters()
    if not dead:
        return 0
    untaken = Job.objects.filter(status=Status.PROCESSING, lease_owner="").exclude(project__kind__in=runner_registry.kinds())
    claims = untaken.filter(task_id="", lease_expires_at__gt=Now()).update(lease_expires_at=Now() - timedelta(seconds=1))
    collections = (
        untaken.exclude(task_id="")
        .filter(lease_expires_at__isnull=True, poll_claimed_until__gt=Now())
        .update(poll_claimed_until=None, next_poll_at=db_now())  # a value: the poller's claim compares it
    )
    # a tombstone, not a delete: the workers page lists the dead cluster and what it held
    Heartbeat.objects.filter(id__in=dead).update(released_at=Now())
    if claims or collections:
        log.warning("worker cluster(s) gone: released %s claims and %s collections they may have held", claims, collections)
    return claims + collections


def _heal(*, include_dead_owners: bool) -> int:
    if include_dead_owners:
        release_dead_clusters_handoffs()
    healed = 0
    for rows in _batches(_stalled().filter(Q(lease_expires_at__lt=Now()) | Q(lease_expires_at__isnull=True))):
        healed += heal_stalled(rows)
    # A retry that was adopting a kept task id when its worker stopped: the remote task
    # still holds the slot, so it becomes an ordinary detached job, polled at once.
    # The same for a collector that stopped while downloading a finished task.
    healed += _back_to_poller(Q(lease_expires_at__lt=Now()))
    if include_dead_owners:
        healed += _heal_dead_owners(db_now())
    return healed


def _stalled():
    """Running jobs without a task id (not a runner's), as the rows heal_stalled takes."""
    return (
        Job.objects.filter(status=Status.PROCESSING, task_id="")
        .exclude(project__kind__in=runner_registry.kinds())
        .values_list(
            "id",
            "lease_owner",
            "attempts",
            "active_provider__max_attempts",
            "lease_expires_at",
            "active_provider__options",
            "project__kind",
        )
    )


def dead_owners(now) -> list[str]:
    """The distinct owners of live leases (non-runner work) whose process is dead. Asked
    once per owner, not once per job: a heal every 2 s must not walk every running job."""
    owners = (
        Job.objects.filter(status=Status.PROCESSING, lease_expires_at__gte=now)
        .exclude(lease_owner="")
        .exclude(project__kind__in=runner_registry.kinds())
        .values_list("lease_owner", flat=True)
        .distinct()
    )
    return [owner for owner in owners.order_by("lease_owner") if heartbeats.owner_is_dead(owner, now=now)]


def _heal_dead_owners(now) -> int:
    dead = dead_owners(now)
    if not dead:
        return 0
    healed = 0
    # A running job of a silent host waits for its lease: rerunning it while a cut-off
    # worker is still inside the provider call would pay twice and put one call more in
    # flight than the provider's concurrency allows. Collections below only download.
    certain = [owner for owner in dead if heartbeats.death_is_certain(owner)]
    for rows in _batches(_stalled().filter(lease_expires_at__gte=now, lease_owner__in=certain)):
        healed += heal_stalled(rows, dead_owners=certain)
    # A collector (or an adopting retry) that died with the lease: back to the poller now,
    # not when the lease lapses. The owner in the filter keeps a successor's lease.
    return healed + _back_to_poller(Q(lease_expires_at__gte=now, lease_owner__in=dead))


def _back_to_poller(lease_gone: Q) -> int:
    """Detached jobs whose worker (an adopting retry, a collector) is gone go back to the
    poller, checked at once, per batch in one transaction (transitions.jobs_back_to_polling)."""
    gone = Q(status=Status.PROCESSING) & ~Q(task_id="") & lease_gone
    jobs = Job.objects.filter(gone).exclude(project__kind__in=runner_registry.kinds())
    moved = 0
    for rows in _batches(jobs.values_list("id")):
        moved += len(transitions.jobs_back_to_polling([row[0] for row in rows], gone=gone))
    return moved


def recover() -> dict:
    """The recovery scan. Returns counts of what it did."""
    with dispatch.deferred_wakes():
        return _recover()


def _recover() -> dict:
    counts = {"healed": 0, "detached_resumed": 0, "runner_adopted": 0, "dispatched": 0}
    counts["healed"] = heal()
    now = db_now()
    detached = (
        Job.objects.filter(status=Status.PROCESSING)
        .exclude(task_id="")
        .exclude(project__kind__in=runner_registry.kinds())
        .values_list("id")
    )
    for rows in _batches(detached):
        ids = [row[0] for row in rows]
        counts["detached_resumed"] += (
            Job.objects.filter(id__in=ids, status=Status.PROCESSING)
            .exclude(task_id="")
            .update(next_poll_at=now, poll_claimed_until=None, task_observed_at=now)
        )
    for kind, runner in runner_registry.RUNNERS.items():
        try:
            counts["runner_adopted"] += runner.recover() or 0
        except Exception:
            log.exception("runner %s recovery failed", kind)
    counts["dispatched"] = dispatch.ping_safety_net()
    return counts
