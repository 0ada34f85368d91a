"""The queue service: the recovery scan on start, then the timers.

Shaped like healthchecks' `sendalerts`: a loop of small steps, each returning whether it
did something, so a test calls one step with a controlled clock. The real work goes to
the workers; detached tasks' HTTP checks run here on a bounded thread pool.

Steps: heartbeat (HEARTBEAT_SECONDS); heal expired leases (HEAL_INTERVAL_SECONDS) and the
work of dead processes (DEAD_OWNER_SECONDS); the dispatch safety net
(DISPATCH_SAFETY_NET_SECONDS); a wake when a cool-down or backoff ends (wake_schedule);
every second, due detached polls, runner ticks and finish notifications; every minute, up
to 50 uploaded reference images no job named for a day (storage.references_prune); every
15 s, tasks left at a provider by jobs that ended (orphans.sweep); every minute, the
pruning of old live events; every minute, the attempt log's roll-up and the pruning
of attempts past ATTEMPT_RETENTION_DAYS (engine/attempt_tally).
"""

import logging
import os
import socket
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connections
from django.utils import timezone

from queue_app.engine import attempt_tally, dispatch, heartbeats, runner_registry, wake_schedule
from queue_app.engine.clock import db_now
from queue_app.models import Heartbeat, ProjectEvent
from queue_app.notifications import outbox
from queue_app.queue_service import orphans, poll_pool, recovery
from queue_app.services.storage import references_prune

log = logging.getLogger(__name__)

EVENT_BATCH, EVENT_PRUNE_BATCHES = 1000, 20  # 20,000 live events a minute at most
HEARTBEAT_RETENTION = timedelta(days=7)
REFERENCE_BATCH = 50  # unused uploads removed per minute at most: a short statement each
ROLLUP_STEPS = 4  # hours of the attempt log rolled up per minute at most
ATTEMPT_BATCH, ATTEMPT_PRUNE_BATCHES = 500, 10  # short transactions, 5,000 attempts a minute at most
# How often the schedule of wake moments is re-read (cool-downs and backoffs written by
# workers meanwhile), and how long the idle loop sleeps at most.
WAKE_REFRESH_SECONDS = 0.25
IDLE_SLEEP_SECONDS = 0.25
# Fire a little after the moment: the database's clock decides whether it has passed.
WAKE_MARGIN = timedelta(milliseconds=5)


class QueueService:
    def __init__(self):
        self.name = f"queue_service:{socket.gethostname()}:{os.getpid()}"
        self.started_at = timezone.now()
        self.last_run: dict[str, float] = {}
        self.stopping = False
        self.poller: poll_pool.Poller | None = None
        self.push_sender: outbox.Sender | None = None
        self.orphan_sweep: threading.Thread | None = None
        self.wake_at = None  # the next cool-down or backoff end, from wake_schedule
        self.wake_read_at = None
        self.clock_offset = timedelta(0)  # the database's clock minus this process's

    def due(self, step: str, every: float) -> bool:
        now = time.monotonic()
        if now - self.last_run.get(step, -1e9) >= every:
            self.last_run[step] = now
            return True
        return False

    # --- steps (each returns whether it did something) ---

    def step_heartbeat(self) -> bool:
        heartbeats.beat(Heartbeat.Role.QUEUE_SERVICE, name=self.name, started_at=self.started_at)
        return False

    def step_heal(self) -> bool:
        return recovery.heal() > 0

    def step_heal_dead_owners(self) -> bool:
        return recovery.heal_dead_owners() > 0

    def step_dispatch(self) -> bool:
        return dispatch.ping_safety_net() > 0

    def db_clock(self):
        """The database's time between reads, from this process's clock and the offset
        measured at the last read. Cool-down and backoff ends are the database's moments: a
        host whose clock runs ahead would skip every one that ends within its lead (and
        leave it to the 3 s sweep), one behind would fire late."""
        return timezone.now() + self.clock_offset

    def measure_clock(self):
        now = db_now()
        self.clock_offset = now - timezone.now()
        return now

    def step_wake(self, now=None) -> bool:
        """Dispatch at the moment a cool-down or backoff ends, then read the next moment.
        `now` is on the database's clock."""
        measured = now is None
        now = now or self.db_clock()
        fired = did = False
        if self.wake_at is not None and now >= self.wake_at + WAKE_MARGIN:
            fired, self.wake_at = True, None
            did = dispatch.ping_safety_net() > 0
        stale = self.wake_read_at is None or (now - self.wake_read_at).total_seconds() >= WAKE_REFRESH_SECONDS
        if fired or stale:
            if measured:
                now = self.measure_clock()
            self.wake_at = wake_schedule.next_moment(now)
            self.wake_read_at = now
        return did

    def idle_sleep(self, now=None) -> float:
        """How long the idle loop may sleep without missing the next wake moment."""
        if self.wake_at is None:
            return IDLE_SLEEP_SECONDS
        until = (self.wake_at + WAKE_MARGIN - (now or self.db_clock())).total_seconds()
        return min(IDLE_SLEEP_SECONDS, max(0.0, until))

    def step_poll(self, now=None) -> bool:
        # The checks run on the poller's own threads; this step only claims and starts them.
        if self.poller is None:
            self.poller = poll_pool.Poller()
        return self.poller.step(now=now) > 0

    def step_runners(self) -> bool:
        did = False
        for kind, runner in runner_registry.RUNNERS.items():
            try:
                did = bool(runner.tick()) or did
            except Exception:
                log.exception("runner %s tick failed", kind)
        return did

    def step_prune(self, now=None) -> bool:
        """Live events older than EVENT_RETENTION_HOURS, in short batches (no long lock on
        the outbox the relay reads), and dead processes' rows past the workers page's view."""
        now = now or timezone.now()
        old = ProjectEvent.objects.filter(created_at__lt=now - timedelta(hours=settings.EVENT_RETENTION_HOURS))
        deleted = 0
        for _ in range(EVENT_PRUNE_BATCHES):
            ids = list(old.order_by("created_at").values_list("id", flat=True)[:EVENT_BATCH])
            if not ids:
                break
            deleted += ProjectEvent.objects.filter(id__in=ids).delete()[0]
        Heartbeat.objects.filter(seen_at__lt=now - HEARTBEAT_RETENTION).delete()
        return deleted > 0

    def step_roll_up(self, now=None) -> bool:
        # A few hours of log a tick at most: a catch-up must not hold up healing for long.
        return attempt_tally.roll_up(now=now, steps=ROLLUP_STEPS) > 0

    def step_prune_attempts(self, now=None) -> bool:
        days = settings.ATTEMPT_RETENTION_DAYS
        if days <= 0:
            return False
        pruned = 0
        for _ in range(ATTEMPT_PRUNE_BATCHES):
            done = attempt_tally.prune(older_than=timedelta(days=days), batch=ATTEMPT_BATCH, now=now)
            pruned += done
            if done < ATTEMPT_BATCH:
                break
        return pruned > 0

    def step_prune_references(self, now=None) -> bool:
        return references_prune(now=now, batch=REFERENCE_BATCH) > 0

    def step_orphans(self) -> bool:
        # On its own thread (provider requests), one sweep at a time.
        if self.orphan_sweep is None or not self.orphan_sweep.is_alive():
            self.orphan_sweep = threading.Thread(target=orphans.sweep_in_thread, name="orphan-sweep", daemon=True)
            self.orphan_sweep.start()
        return False

    def step_notify(self, now=None) -> bool:
        # Pushes are sent on the sender's own threads; this step only starts them.
        if self.push_sender is None:
            self.push_sender = outbox.Sender()
        return outbox.step(now=now, sender=self.push_sender) > 0

    def tick(self) -> bool:
        """One pass over the steps that are due. Returns whether anything happened."""
        close_old_connections()
        did = False
        if self.due("heartbeat", settings.HEARTBEAT_SECONDS):
            self.step_heartbeat()
        if self.due("heal", settings.HEAL_INTERVAL_SECONDS):
            did = self.step_heal() or did
        elif self.due("heal_dead_owners", settings.DEAD_OWNER_SECONDS):
            did = self.step_heal_dead_owners() or did
        if self.due("dispatch", settings.DISPATCH_SAFETY_NET_SECONDS):
            did = self.step_dispatch() or did
        did = self.step_wake() or did
        if self.due("poll", 1.0):
            did = self.step_poll() or did
        if self.due("runners", 0.5):
            did = self.step_runners() or did
        if self.due("notify", 1.0):
            did = self.step_notify() or did
        if self.due("prune", 60):
            self.step_prune()
        if self.due("roll_up", 60):
            did = self.step_roll_up() or did
        if self.due("prune_attempts", 60):
            did = self.step_prune_attempts() or did
        if self.due("prune_references", 60):
            did = self.step_prune_references() or did
        if self.due("orphans", orphans.SWEEP_SECONDS):
            did = self.step_orphans() or did
        return did

    def recover_on_start(self) -> dict | None:
        """The recovery scan, tried again until it completes: a database that drops the
        connection while the service starts must not take the queue's healer down with
        it (a chaos run lost its only queue service that way for a minute)."""
        delay = 0.5
        while not self.stopping:
            try:
                counts = recovery.recover()
            except Exception:
                log.exception("recovery scan failed; trying again in %.1f s", delay)
                connections.close_all()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            log.info("recovery scan: %s", counts)
            return counts
        return None

    def run(self, *, max_ticks: int | None = None) -> None:
        self.recover_on_start()
        ticks = 0
        while not self.stopping:
            try:
                did = self.tick()
            except Exception:
                # A broken step must not put the service into a crash loop; the next tick
                # (with fresh connections) tries again.
                log.exception("queue service tick failed")
                did = False
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
            if not did:
                time.sleep(self.idle_sleep())
        if self.poller is not None:
            self.poller.close()
