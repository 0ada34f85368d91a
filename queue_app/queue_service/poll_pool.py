"""The queue service's poll threads: a pool of POLL_PARALLELISM checks that a step fills
without waiting for them, so a slow provider never holds up the loop.

A step claims due work (poller.claim_due) up to the free threads, and per provider record
at most half of them, so a provider that hangs cannot take every thread. While work is
left over, a thread whose check ended claims the next one itself instead of idling until
the next step. Each record's status requests keep to its budget (providers/budget.py): a
step claims only what the next second of turns allows; a family with a list endpoint is
checked in batches (poll_batch.py), one batch in flight per record.
"""

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from functools import partial

from django.conf import settings
from django.db import close_old_connections, connection

from queue_app.engine.clock import db_now
from queue_app.models import Provider
from queue_app.providers import budget
from queue_app.providers.base import ProviderError
from queue_app.queue_service import poll_batch, poller

log = logging.getLogger(__name__)

# A step claims only the checks whose budget turns start within this: a check never
# holds a thread long waiting for its turn.
TURN_HORIZON_SECONDS = 1.0
# How often the poller re-reads the provider records' families and budgets.
RECORDS_TTL_SECONDS = 5.0


class Poller:
    """The pool (the module docstring says how it fills): `step` claims and starts checks,
    `wait` waits for them (a graceful stop), `close` lets the ones in flight end alone."""

    def __init__(self, *, parallelism: int | None = None, per_provider: int | None = None, clock=None, sleep=None):
        self.parallelism = max(1, parallelism or settings.POLL_PARALLELISM)
        self.per_provider = max(1, per_provider or (self.parallelism + 1) // 2)
        self._pool = ThreadPoolExecutor(max_workers=self.parallelism, thread_name_prefix="poll")
        self._lock = threading.Lock()
        self._stepping = threading.Lock()  # one claim at a time, or two could both fill the free threads
        self._inflight: dict[int, int] = {}
        self._batching: set = set()
        self._leftovers: dict[int, deque] = {}  # provider id -> (job id, token) a batch left for single checks
        self._futures: set = set()
        self._backlog = False
        self._refill_wanted = False
        self._closed = False
        self._timing = {key: value for key, value in (("clock", clock), ("sleep", sleep)) if value}
        self._spacings: dict[int, budget.Spacing] = {}
        self._records: dict[int, dict] = {}
        self._records_read = float("-inf")
        self._batch_idle_until: dict[int, float] = {}
        self._clock = self._timing.get("clock", time.monotonic)

    def spacing(self, provider_id: int) -> budget.Spacing:
        """The budget of one provider record (its rate as last read)."""
        record = self._records.get(provider_id) or {}
        rate = budget.per_minute(record.get("family", ""), record.get("options"))
        spacing = self._spacings.get(provider_id)
        if spacing is None:
            spacing = self._spacings[provider_id] = budget.Spacing(rate, **self._timing)
        elif spacing.gap != 60.0 / rate:
            spacing.set_rate(rate)
        return spacing

    def _read_records(self) -> None:
        # A record's family and options change rarely: read every few seconds, not per step.
        if self._clock() - self._records_read >= RECORDS_TTL_SECONDS:
            self._records = {row["id"]: row for row in Provider.objects.values("id", "family", "options")}
            self._records_read = self._clock()

    def step(self, *, now=None, families=None) -> int:
        """Claim what is due and start its checks. Returns how many were started."""
        with self._stepping:
            started = self._step(now=now, families=families)
        # A check or batch that ended during this step found it running and left its refill
        # to it: take that refill now, or what the batch left waits for the next step.
        if self._refill_wanted:
            self._refill()
        return started

    def _step(self, *, now=None, families=None) -> int:
        with self._lock:
            free = self.parallelism - sum(self._inflight.values())
            busy = dict(self._inflight)
        if free <= 0 or self._closed:
            return 0
        self._read_records()
        batched = {
            pid
            for pid, row in self._records.items()
            if _batch_size(row["family"]) > 1 and (not families or row["family"] in families)
        }
        started = self._start_leftovers(free, busy, now=now)
        for provider_id in sorted(batched - self._batching):
            if started >= free:
                break
            started += self._start_batch(provider_id, now=now)
        allowance = {pid: self.spacing(pid).free(TURN_HORIZON_SECONDS) for pid in self._records if pid not in batched}
        claimed = poller.claim_due(
            now=now,
            families=families,
            limit=free - started,
            busy=busy,
            per_provider=self.per_provider,
            allowance=allowance,
            exclude_providers=batched,
        )
        for job_id, token, provider_id in claimed:
            self._start_single(job_id, token, provider_id, now=now)
        started += len(claimed)
        with self._lock:
            leftover = any(self._leftovers.values())
        self._backlog = (bool(started) or leftover) and families is None
        return started

    def _start_leftovers(self, free: int, busy: dict, *, now=None) -> int:
        """Start the single checks batches left (still claimed), at most `per_provider`
        at once per record like any claim, so they never queue ahead of other providers."""
        started = 0
        with self._lock:
            waiting = {pid: queue for pid, queue in self._leftovers.items() if queue}
        for provider_id, queue in waiting.items():
            room = min(self.per_provider - busy.get(provider_id, 0), free - started)
            for _ in range(max(0, room)):
                with self._lock:
                    if not queue:
                        break
                    job_id, token = queue.popleft()
                self._start_single(job_id, token, provider_id, now=now)
                busy[provider_id] = busy.get(provider_id, 0) + 1
                started += 1
        return started

    def _submit(self, provider_id, fn, *args, **kwargs) -> None:
        with self._lock:
            self._inflight[provider_id] = self._inflight.get(provider_id, 0) + 1
        future = self._pool.submit(fn, *args, **kwargs)
        self._futures.add(future)
        future.add_done_callback(partial(self._done, provider_id))

    def _start_single(self, job_id, token, provider_id, *, now=None) -> None:
        spacing = self.spacing(provider_id)
        [turn] = spacing.reserve(1)
        self._submit(provider_id, _check_in_thread, job_id, token, now=now, turn=partial(spacing.wait_until, turn))

    def _start_batch(self, provider_id: int, *, now=None) -> int:
        if self._batch_idle_until.get(provider_id, float("-inf")) > self._clock():
            return 0
        family = self._records[provider_id]["family"]
        spacing = self.spacing(provider_id)
        pages = spacing.free(TURN_HORIZON_SECONDS)
        if pages <= 0:
            return 0
        token, job_ids = poll_batch.claim_batch(
            provider_id,
            now=now or db_now(),
            limit=pages * _batch_size(family),
            claim_seconds=poller.POLL_CLAIM_SECONDS,
        )
        if not job_ids:
            # Nothing due: the threads' refills need not ask again for a second.
            self._batch_idle_until[provider_id] = self._clock() + TURN_HORIZON_SECONDS
            return 0
        turns = spacing.reserve(min(pages, -(-len(job_ids) // _batch_size(family))))
        with self._lock:
            self._batching.add(provider_id)
        self._submit(provider_id, self._batch_in_thread, provider_id, job_ids, token, turns, now=now)
        return 1

    def _batch_in_thread(self, provider_id, job_ids, token, turns, *, now=None) -> None:
        close_old_connections()
        try:
            family = self._records[provider_id]["family"]
            left = poll_batch.check_batch(
                job_ids, token, adapter=poller.adapter_for(family), spacing=self.spacing(provider_id), turns=turns, now=now
            )
            # What the list could not settle (finished, failed, unseen, timed out) is
            # checked on its own, each on a turn of the same budget, as threads free up.
            with self._lock:
                self._leftovers.setdefault(provider_id, deque()).extend((job_id, token) for job_id in left)
                if left:
                    self._backlog = True
        except Exception:
            log.exception("batch status check of provider %s failed; its claims lapse", provider_id)
        finally:
            with self._lock:
                self._batching.discard(provider_id)
            close_old_connections()

    def _done(self, provider_id, future) -> None:
        with self._lock:
            self._inflight[provider_id] -= 1
            if not self._inflight[provider_id]:
                del self._inflight[provider_id]
            self._futures.discard(future)
        if self._backlog:
            self._refill()

    def _refill(self) -> None:
        # A claim already running elsewhere (or this check ended inside a step, before
        # its callback was set) steps again for us when it is done (`step` and this loop
        # both look at the flag after releasing the lock): nothing is dropped.
        self._refill_wanted = True
        while self._refill_wanted and not self._closed and self._stepping.acquire(blocking=False):
            try:
                self._refill_wanted = False
                self._step()
            except Exception:
                log.warning("poll refill failed; the next step claims", exc_info=True)
            finally:
                self._stepping.release()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the checks started so far, and those they started (tests; a graceful stop)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            pending = [future for future in list(self._futures) if not future.done()]
            if pending:
                wait_for_futures(pending, timeout=None if deadline is None else deadline - time.monotonic())
                continue
            with self._lock:
                leftover = any(self._leftovers.values())
            # A finished check's callback may be refilling (or about to): give it a moment.
            time.sleep(0.02)
            if not leftover and not self._stepping.locked() and not any(not f.done() for f in list(self._futures)):
                return

    def close(self) -> None:
        # Checks in flight finish on their own (bounded by their HTTP timeouts); a check
        # that never applies its result leaves a claim that lapses.
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)


def _batch_size(family: str) -> int:
    try:
        return budget.batch_size(family, adapter=poller.adapter_for(family))
    except ProviderError:
        return 1


def _check_in_thread(job_id, token, *, now=None, keep_connection: bool = True, turn=None):
    # The Poller's long-lived threads keep their connection between checks (CONN_MAX_AGE),
    # dropping it only when it is broken or old: a new PostgreSQL connection per check
    # would cost more than the check. A one-off pool's threads end with the cycle, so they
    # close theirs (a dead thread's connection is not closed for it).
    close_old_connections()
    try:
        return poller.check_job(job_id, token, now=now, turn=turn)
    except Exception:
        log.exception("poll of job %s failed", job_id)
    finally:
        if keep_connection:
            close_old_connections()
        else:
            connection.close()
