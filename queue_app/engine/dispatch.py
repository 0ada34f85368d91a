"""Dispatch: claim pending jobs into a provider's free slots, as one short transaction
with no network I/O: lock the provider row (PostgreSQL FOR NO KEY UPDATE, which does not
block inserts of jobs that reference it; SQLite's IMMEDIATE transaction already holds the
write lock), read the slots its processing jobs hold (no counter to drift), claim the
next dispatchable jobs in fair-share order (fair_share.py) into the free ones and enqueue their execution (in the same
transaction with the ORM broker, on commit with Redis).

Lock order everywhere: provider row, then job rows, then project rows (events). The one
exception is the handover (`Handover`), which holds its worker's own processing row before
it takes the provider lock: no holder of a provider lock ever waits for a processing row,
and it skips pending rows that are held rather than wait for them.
"""

import itertools
import logging
import threading
import time
from contextlib import contextmanager

from django.db import IntegrityError, connections, transaction
from django.db.models import Count, Q
from django.db.models.functions import Now
from django.utils import timezone

from queue_app.engine import attempts, budgets, enqueue, fair_share, heartbeats, hot_sql, runner_registry, snapshot, transitions
from queue_app.models import Job, Provider, Status

log = logging.getLogger(__name__)


_local = threading.local()


@contextmanager
def refilled_by_caller(provider_id: int):
    """Within this block, wake-ups skip `provider_id`: the calling worker refills the
    slot it frees itself (`dispatch(…, hold_one=True)`) instead of handing the next job
    to the broker, which on the ORM broker costs a poll interval."""
    previous = getattr(_local, "skip", frozenset())
    _local.skip = previous | {provider_id}
    try:
        yield
    finally:
        _local.skip = previous


@contextmanager
def deferred_wakes():
    """Within this block, wake-ups only collect provider and project ids; they are
    dispatched once at the end. The recovery scan heals thousands of jobs: one dispatch
    per provider, not one per healed job."""
    outer = getattr(_local, "deferred", None)
    if outer is not None:
        yield
        return
    _local.deferred = ({}, set(), set())
    try:
        yield
    finally:
        _, provider_ids, project_ids = _local.deferred
        _local.deferred = None
        wake(provider_ids=provider_ids, project_ids=project_ids)


def dispatch(provider_id: int, *, hold_one: bool = False) -> list[tuple]:
    """Claim what fits into the provider's free slots. Returns [(job_id, token)] claimed.

    With `hold_one`, the first claimed job is not enqueued: the calling worker runs it
    itself right away (a freed slot is refilled without a trip through the broker).
    """
    claimed = []
    try:
        with transaction.atomic():
            provider = _lock_provider(provider_id)
            if provider is None:
                return []
            claimed = _claim_free_slots(provider, hold_one=hold_one)
    except IntegrityError:
        # The (provider, slot) unique index caught a double claim: a bug signal, never
        # a double run. Nothing was written; the next wake-up tries again.
        log.error("slot constraint refused a claim for provider %s", provider_id, exc_info=True)
        return []
    return claimed


def _lock_provider(provider_id: int, *, shared: bool = False) -> Provider | None:
    """The provider row, locked for claims until commit — None when it is paused or cooling
    down (nothing is claimed for it then, and nothing locked). `shared`: a handover's lock
    (hot_sql.lock_provider)."""
    return hot_sql.lock_provider(provider_id, shared=shared)


def _claim_free_slots(provider: Provider, *, hold_one: bool, skip_locked: bool = False) -> list[tuple]:
    """Under the provider's lock: claim the next dispatchable jobs into its free slots and
    enqueue them (all but the first with `hold_one`). `skip_locked` passes over pending rows
    another transaction holds. Returns [(job_id, token)]."""
    return [(job.id, token) for job, token in _claim_rows(provider, hold_one=hold_one, skip_locked=skip_locked)]


def _claim_rows(
    provider: Provider,
    *,
    hold_one: bool,
    skip_locked: bool = False,
    into_slot: int | None = None,
    lease_owner: str = "",
    busy: int = 0,
) -> list[tuple]:
    """_claim_free_slots, returning [(job, token)]: each job as it now stands in the
    database, but for its lease's expiry (the database's clock). `into_slot`: claim at
    most one job, into that slot (a handover's: the slot its own job left), under
    `lease_owner`'s lease, with `busy` slots held besides."""
    if into_slot is None:
        used = hot_sql.slots_in_use(provider.id)
        busy = len(used)
    # After the limit was lowered, running work may sit in slots above it: the
    # count of held slots caps the claims, not only which low numbers are free.
    room = provider.concurrency - busy
    if room <= 0:
        return []
    if into_slot is not None:
        room = 1
    # Real rows first, then as many free slot numbers as there are candidates: the
    # cost under the lock follows the jobs, never the configured number (a
    # concurrency of millions must not build a list of millions here).
    candidates = hot_sql.dispatchable_with_projects(
        provider.id,
        projects=None,
        excluded_kinds=runner_registry.kinds(),
        limit=room,
        skip_locked=skip_locked,
        margin=provider.concurrency,
    )
    if into_slot is not None:
        free = [into_slot]
    else:
        free = list(itertools.islice((slot for slot in itertools.count() if slot not in used), len(candidates)))
    claims = [(job, slot, snapshot.build(job, job.project, provider)) for job, slot in zip(candidates, free, strict=False)]
    claims, _ = budgets.affordable(provider, claims)  # a claim never crosses a budget
    started_at = timezone.now()
    # A handover's one job is claimed under its worker's lease: no lease_take after.
    owner = lease_owner if into_slot is not None else ""
    claimed = transitions.jobs_claim(claims, provider_id=provider.id, owner=owner, started_at=started_at, provider=provider)
    if claimed and candidates[0].contenders > 1:
        # Projects contend for this provider: whose turn it was is recorded, last in
        # the lock order (fair_share.ShareTurn).
        moved = {job_id for job_id, _ in claimed}
        fair_share.record_turns(provider.id, [job.project_id for job in candidates if job.id in moved], started_at)
    for job_id, token in claimed[1:] if hold_one else claimed:
        enqueue.enqueue_execution(job_id, token)
    by_id = {job.id: (job, slot, snap) for job, slot, snap in claims}
    return [
        (hot_sql.as_claimed(*by_id[job_id], provider=provider, token=token, started_at=started_at, owner=owner), token)
        for job_id, token in claimed
    ]


class Handover:
    """One commit per handover: the output writer's transaction, once the worker's job has
    left its slot, claims the provider's next job into that slot and opens its attempt
    under this worker's lease (`claim`), so the worker runs it without a broker trip.

    The provider lock is taken shared (FOR SHARE): handovers of one provider run side by
    side, each refilling only the slot its own job left, while a dispatch, a cool-down or
    an edit of the provider waits for them. Holding its own row first is safe: a provider
    lock's holder touches pending rows only. The candidate is taken with SKIP LOCKED (a
    row a cancel or a project delete holds may be waiting for this worker's row). After
    commit `held` is (job, token, attempt), `done` says the claim committed, `more_room`
    asks for a dispatch for slots free besides; `carry_on` False sends it to the broker."""

    def __init__(self, provider_id: int, *, carry_on: bool = True):
        self.provider_id = provider_id
        self.carry_on = carry_on
        self.held = None
        self.done = False
        self.more_room = False

    def claim(self, vacated_slot: int | None) -> None:
        self.held, self.done, self.more_room = None, False, False
        provider = _lock_provider(self.provider_id, shared=vacated_slot is not None)
        if provider is None:
            # Paused or cooling down: its resume or the end of its cool-down wakes
            # dispatch, as for any provider.
            transaction.on_commit(self._committed(None, more_room=False))
            return
        held, more_room = None, False
        worker = heartbeats.process_name() if self.carry_on else ""
        if vacated_slot is not None and vacated_slot >= provider.concurrency:
            # The limit was lowered below this slot: whatever room there is, a dispatch
            # after commit fills it from the lowest free numbers.
            transaction.on_commit(self._committed(None, more_room=True))
            return
        try:
            # A savepoint: the slot index refusing a claim must not undo the completion.
            with transaction.atomic():
                if vacated_slot is None:
                    claimed = _claim_rows(provider, hold_one=self.carry_on, skip_locked=True)
                else:
                    claimed = _claim_rows(
                        provider,
                        hold_one=self.carry_on,
                        skip_locked=True,
                        into_slot=vacated_slot,
                        lease_owner=worker,
                        busy=provider.busy_slots,
                    )
                    # Room beyond the vacated slot: a dispatch after commit fills it.
                    more_room = bool(claimed) and provider.concurrency - provider.busy_slots > 1
                if claimed and self.carry_on:
                    held = self._open(*claimed[0], worker=worker, lease_taken=vacated_slot is not None)
        except IntegrityError:
            log.error("slot constraint refused a handover claim for provider %s", self.provider_id, exc_info=True)
            return
        transaction.on_commit(self._committed(held, more_room=more_room))

    def _open(self, job, token, *, worker: str, lease_taken: bool):
        # The claim was made a statement ago under the provider lock: the job in hand is
        # the row as claimed, and is not read again.
        if lease_taken:
            return job, token, attempts.attempt_open(job, worker)
        attempt = attempts.attempt_begin(job, token)
        if attempt is None:
            # Not ours after all (cannot happen under the provider lock): the broker runs it.
            enqueue.enqueue_execution(job.id, token)
            return None
        return job, token, attempt

    def _committed(self, held, *, more_room: bool):
        def committed():
            self.held, self.done, self.more_room = held, True, more_room

        return committed


def wake(*, provider_ids=(), project_ids=()) -> None:
    """Dispatch right away for these providers, and for the providers (or runners) of
    these projects' pending jobs. Best effort: the queue service's timer is the net."""
    deferred = getattr(_local, "deferred", None)
    if deferred is not None:
        deferred[1].update(provider_ids)
        deferred[2].update(project_ids)
        return
    provider_ids = set(provider_ids) - getattr(_local, "skip", frozenset())
    if project_ids:
        rows = Job.objects.filter(project_id__in=project_ids, status=Status.PENDING).values_list(
            "provider_id", "project__provider_id", "project__kind", "project_id"
        )
        runner_projects = {}
        for provider_id, project_provider_id, kind, project_id in rows.distinct():
            if kind in runner_registry.RUNNERS:
                runner_projects.setdefault(kind, set()).add(project_id)
            elif provider_id or project_provider_id:
                provider_ids.add(provider_id or project_provider_id)
        provider_ids -= getattr(_local, "skip", frozenset())
        for kind, ids in runner_projects.items():
            try:
                runner_registry.RUNNERS[kind].wake(ids)
            except Exception:
                log.warning("runner %s wake failed", kind, exc_info=True)
    for provider_id in sorted(provider_ids):
        try:
            dispatch(provider_id)
        except Exception:
            log.warning("dispatch of provider %s failed; the safety net will retry", provider_id, exc_info=True)


# A timer wake fires a little after the cool-down's end: the database's clock decides
# whether it has passed, and a wake that finds it not over yet claims nothing.
WAKE_LATER_MARGIN_SECONDS = 0.05
_timers: dict[int, tuple[float, threading.Timer]] = {}  # provider id → this process's latest timed wake
_timers_lock = threading.Lock()


def wake_later(provider_id: int, seconds: float) -> None:
    """Dispatch for this provider once `seconds` have passed (the end of a cool-down this
    process just wrote), from a timer thread of this process. The queue service's wake
    schedule does the same; this one also fires while the queue service is restarting,
    whose start-up left a cooled provider's slots idle for 1.3-2.6 s in bench.idle_slots.
    A process that dies first loses its timer: the service's schedule is the net."""
    fire_at = time.monotonic() + seconds + WAKE_LATER_MARGIN_SECONDS
    with _timers_lock:
        if provider_id in _timers and _timers[provider_id][0] >= fire_at:
            return  # a later (longer) cool-down's wake is already set
        timer = threading.Timer(seconds + WAKE_LATER_MARGIN_SECONDS, _wake_on_timer, args=(provider_id, fire_at))
        timer.daemon = True
        _timers[provider_id] = (fire_at, timer)
    timer.start()


def _wake_on_timer(provider_id: int, fire_at: float) -> None:
    try:
        with _timers_lock:
            if provider_id in _timers and _timers[provider_id][0] == fire_at:
                del _timers[provider_id]
        wake(provider_ids={provider_id})
    except Exception:
        log.warning("timed wake of provider %s failed; the queue service's schedule is the net", provider_id, exc_info=True)
    finally:
        connections.close_all()  # this thread's own connections


def providers_with_work() -> list[int]:
    """Providers that are not paused or cooling down and have dispatchable pending jobs
    and a free slot — the safety net's to-do list (two small grouped queries)."""
    pending = (
        Job.objects.filter(status=Status.PENDING)
        .exclude(project__kind__in=runner_registry.kinds())
        .filter(Q(not_before__isnull=True) | Q(not_before__lte=Now()))
        .values_list("provider_id", "project__provider_id")
        .distinct()
    )
    wanted = {job_provider or project_provider for job_provider, project_provider in pending} - {None}
    if not wanted:
        return []
    providers = Provider.objects.filter(id__in=wanted, paused=False).filter(
        Q(cooldown_until__isnull=True) | Q(cooldown_until__lte=Now())
    )
    active = dict(
        Job.objects.filter(status=Status.PROCESSING, active_provider_id__in=wanted)
        .values_list("active_provider_id")
        .annotate(n=Count("id"))
    )
    return [p.id for p in providers.order_by("id") if active.get(p.id, 0) < p.concurrency]


def ping_safety_net() -> int:
    """Dispatch every provider that has work and room. Returns how many it claimed."""
    deferred = getattr(_local, "deferred", None)
    if deferred is not None:
        # Inside deferred_wakes (the recovery scan): the provider wake-ups collected so far
        # are covered by this pass; dispatching them again at the end finds no room.
        deferred[1].clear()
    total = 0
    for provider_id in providers_with_work():
        total += len(dispatch(provider_id))
    return total
