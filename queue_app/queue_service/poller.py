"""Detached polling: checking remote tasks until they finish.

Long because: the claim, the pool that spends each record's status budget and the check
with its outcomes are one flow, looked up through one `adapter_for` that tests replace;
the batch path lives in poll_batch.py.

Cadence: every detached job carries `next_poll_at`, set from its family's cadence when it
is detached and after every check — the default cycle of DETACHED_POLL_SECONDS (30 s),
Civitai every 5 s (its images are usually done within seconds). The queue service looks
for due jobs every second, and a poll thread whose check ends takes the next due one, so
each job is checked on its own cadence, not on a global tick shared with slow ones.

One poll step:
1. claim due detached jobs by `next_poll_at` with a short compare-and-set (a new poll
   token and `poll_claimed_until`), so two cycles or two machines never check one job
   at once — and never more than the free threads, and per provider record at most
   half of them, so a provider that hangs cannot take every thread;
2. run the HTTP checks outside any transaction on a bounded thread pool; the queue
   service does not wait for them (a slow provider delays only its own checks);
3. after its HTTP check returns, every check re-reads the job and applies the result
   with a fenced compare-and-set: a job another cycle finished, or a user cleared or
   retried meanwhile, is left alone.
Budget: every status request waits for a turn of its provider record's budget
(providers/budget.py), and a step claims only what the next second's turns allow; a family
with a list endpoint is checked in batches (poll_batch.py).
A finished task is handed to a worker (`worker/collect.py`), which re-reads the task for fresh
(signed, expiring) URLs and writes it through the output writer, the same one as the
synchronous path; completion frees the slot and wakes dispatch. Poll errors (network,
5xx, bad JSON) never fail a job; the processing timeout does (JOB_PROCESSING_TIMEOUT_MS,
counted from `task_observed_at`, which the recovery scan restarts) and cancels the task at
the provider where its API can (engine/remote_cancel.py). Two exceptions: a
rejected key pauses the provider (the task keeps being checked), and a provider that
refuses POLL_REFUSALS_TO_FAIL checks in a row fails the job with its reason.
"""

import logging
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F

from queue_app import providers
from queue_app.engine import enqueue, events, failpoints, remote_cancel, transitions
from queue_app.engine.attempts import OPEN
from queue_app.engine.clock import db_now
from queue_app.engine.provider_state import pause_for_account
from queue_app.engine.results import Applied, apply_failed, detached_job
from queue_app.engine.snapshot import resolved_job
from queue_app.models import ErrorClass, Job, Provider
from queue_app.providers import adapter_for, budget, poll_seconds
from queue_app.providers.base import AccountError, Failed, Finished, PermanentError, ProviderError, Running
from queue_app.queue_service import poll_batch

log = logging.getLogger(__name__)

# A claimed check must finish within this (the adapters' check timeout is 10 s + 30 s);
# after it a crashed poller's claim lapses and another cycle takes the job.
POLL_CLAIM_SECONDS = 120
# A worker collecting a finished task's outputs (downloads of large videos included).
# How long a finished task waits in the broker for a collector before a poll cycle may
# look at it again; once a worker collects, its renewed lease holds the job instead.
COLLECT_CLAIM_SECONDS = settings.CLAIM_TTL_SECONDS
# Failed checks in a row, the last one a refusal (a 4xx other than "unknown task", which
# adapters report as a dead task at once), after which the job fails: one refusal may be
# a provider's hiccup, a run of them will not end before the processing timeout.
POLL_REFUSALS_TO_FAIL = 3
# A step claims only the checks whose budget turns start within this: a check never
# holds a thread long waiting for its turn.
TURN_HORIZON_SECONDS = 1.0
# How often the poller re-reads the provider records' families and budgets.
RECORDS_TTL_SECONDS = 5.0


def claim_due(
    *,
    now=None,
    families=None,
    limit: int = 500,
    busy: dict | None = None,
    per_provider: int | None = None,
    allowance: dict | None = None,
    exclude_providers=(),
) -> list[tuple]:
    """Claim detached jobs whose next poll is due. Returns [(job_id, poll_token, provider_id)].

    `busy` maps provider ids to checks already running; with `per_provider`, no provider
    gets more than that many checks at once (the rest wait for a later step). `allowance`
    caps a provider's claims at the status requests its budget allows now;
    `exclude_providers` are checked in batches instead (poll_batch)."""
    now = now or db_now()
    busy = dict(busy or {})
    allowance = dict(allowance or {})
    due = poll_batch.due_jobs(now)
    if families:
        due = due.filter(active_provider__family__in=families)
    if exclude_providers:
        due = due.exclude(active_provider_id__in=list(exclude_providers))
    claimed = []
    rows = due.order_by("next_poll_at").values_list("id", "lease_token", "next_poll_at", "active_provider_id")
    for job_id, old_token, next_poll_at, provider_id in rows[: max(limit * 4, 50)]:
        if len(claimed) >= limit:
            break
        if per_provider is not None and busy.get(provider_id, 0) >= per_provider:
            continue
        if provider_id in allowance and allowance[provider_id] <= 0:
            continue
        token = uuid.uuid4()
        # The compare-and-set on the old token and the due time: of two pollers that read
        # the same row, one changes it and the other matches nothing.
        if (
            Job.objects.fenced(job_id, old_token)
            .filter(next_poll_at=next_poll_at)
            .update(lease_token=token, poll_claimed_until=now + timedelta(seconds=POLL_CLAIM_SECONDS))
        ):
            claimed.append((job_id, token, provider_id))
            busy[provider_id] = busy.get(provider_id, 0) + 1
            if provider_id in allowance:
                allowance[provider_id] -= 1
    return claimed


class Poller:
    """The queue service's poller: a thread pool of POLL_PARALLELISM checks that a step
    fills without waiting for them, so a slow provider never holds up the loop. While due
    work is left over (the last step claimed something), a thread whose check finished
    claims the next one itself: the queue service steps once a second, and waiting for
    it left a 100 ms check's thread idle for the rest of that second (8 checks a second
    per provider: ten minutes to go round 5,000 detached tasks instead of one).

    Each provider record's status requests keep to its budget (providers/budget.py): a
    step claims only the checks its next second of turns allows, and each check waits for
    its turn before sending. A family with a list endpoint is checked in batches, one
    batch in flight per record (poll_batch)."""

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
        claimed = claim_due(
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
            claim_seconds=POLL_CLAIM_SECONDS,
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
                job_ids, token, adapter=adapter_for(family), spacing=self.spacing(provider_id), turns=turns, now=now
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
        return budget.batch_size(family, adapter=adapter_for(family))
    except ProviderError:
        return 1


def _check_in_thread(job_id, token, *, now=None, keep_connection: bool = True, turn=None):
    # The Poller's long-lived threads keep their connection between checks (CONN_MAX_AGE),
    # dropping it only when it is broken or old: a new PostgreSQL connection per check
    # would cost more than the check. A one-off pool's threads end with the cycle, so they
    # close theirs (a dead thread's connection is not closed for it).
    close_old_connections()
    try:
        return check_job(job_id, token, now=now, turn=turn)
    except Exception:
        log.exception("poll of job %s failed", job_id)
    finally:
        if keep_connection:
            close_old_connections()
        else:
            connection.close()


def _release_claim(job_id, token, *, family: str, now, **fields) -> bool:
    return bool(
        Job.objects.fenced(job_id, token).update(
            next_poll_at=now + timedelta(seconds=poll_seconds(family)), poll_claimed_until=None, **fields
        )
    )


def check_job(job_id, token, *, now=None, turn=None) -> Applied:
    """Check one claimed detached job and apply the result. Returns what happened.
    `turn` waits for the provider's status budget right before the request."""
    now = now or db_now()
    job = detached_job(job_id, token)
    if job is None:
        return Applied.SKIPPED
    provider = job.active_provider
    failpoints.hit("mid_poll")
    if job.task_observed_at and now - job.task_observed_at > timedelta(milliseconds=settings.JOB_PROCESSING_TIMEOUT_MS):
        return _time_out(job, token)
    try:
        request = resolved_job(job, provider)
        if turn is not None:
            turn()
        state = providers.call(request, adapter_for(provider.family).check, job.task_id, request)
    except Exception as error:
        return _check_failed(job, token, error, now=now)
    # Re-read before acting: the check took a while, and meanwhile the job may have been
    # finished by another cycle, cleared, or retried. Every write below is fenced as well.
    job = detached_job(job_id, token)
    if job is None:
        return Applied.SKIPPED
    if isinstance(state, Running):
        if _release_claim(job.id, token, family=provider.family, now=now, progress=state.progress, poll_failures=0):
            if state.progress is not None:
                events.broadcast_progress(job.project_id, job.id, state.progress)
            return Applied.RUNNING
        return Applied.SKIPPED
    if isinstance(state, Finished):
        return _hand_to_collector(job, token, now=now)
    if isinstance(state, Failed):
        return apply_failed(job, token, state, max_attempts=provider.max_attempts, attempt=OPEN)
    return Applied.UNKNOWN


def _time_out(job: Job, token) -> Applied:
    minutes = settings.JOB_PROCESSING_TIMEOUT_MS / 60000
    reason = (
        f"timed out: the provider reported no result within {minutes:g} minutes (task {job.task_id[:40]}); "
        "retrying checks the task again before submitting anew"
    )
    # The task id stays: a retry looks at the task first and collects it if it finished
    # late, instead of paying for a new one.
    failed = transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.TIMEOUT, attempt=OPEN)
    if failed:
        # Its slot is given away now: stop the task at the provider too, or it keeps
        # running (and billing) beside the job that takes the slot. After the commit,
        # best effort, like a user's cancel.
        remote_cancel.cancel_provider_task(job, provider_id=job.active_provider_id, task_id=job.task_id)
    return Applied.TIMEOUT if failed else Applied.SKIPPED


def _check_failed(job: Job, token, error: Exception, *, now) -> Applied:
    """A check that raised never fails the job by itself; the processing timeout does.
    An account problem pauses the provider; a run of refusals fails the job."""
    provider = job.active_provider
    reason = error.reason if isinstance(error, ProviderError) else type(error).__name__
    if isinstance(error, AccountError):
        # The key or the credit, not the task: the owner must act. The task is paid
        # for, so it keeps being checked (a fixed key collects it).
        pause_for_account(provider, reason)
    elif isinstance(error, PermanentError) and job.poll_failures + 1 >= POLL_REFUSALS_TO_FAIL:
        return _give_up_checking(job, token, reason)
    log.info("poll of job %s failed (%s); will poll again", job.id, reason)
    _release_claim(job.id, token, family=provider.family, now=now, poll_failures=F("poll_failures") + 1)
    return Applied.ERROR


def _hand_to_collector(job: Job, token, *, now) -> Applied:
    # Hold the claim while a worker collects; if that worker dies, the claim lapses
    # and a later cycle finds the task finished again. With the ORM broker the task
    # row commits together with the claim.
    with transaction.atomic():
        held = Job.objects.fenced(job.id, token).update(
            poll_claimed_until=now + timedelta(seconds=COLLECT_CLAIM_SECONDS), poll_failures=0
        )
        if not held:
            return Applied.SKIPPED
        enqueue.enqueue_collection(job.id, token)
    return Applied.FINISHED


def _give_up_checking(job: Job, token, reason: str) -> Applied:
    """The provider keeps refusing to report on the task (400/403/422, not a hiccup): fail
    the job readably instead of polling until the processing timeout. The task id goes:
    nothing can be learnt about it, so a retry submits anew."""
    reason = f"the provider refused {POLL_REFUSALS_TO_FAIL} status checks in a row for task {job.task_id[:40]}: {reason}"
    failed = transitions.job_fail(
        job.id, token, reason=reason, error_class=ErrorClass.PERMANENT, attempt=OPEN, keep_task_id=False
    )
    return Applied.FAILED if failed else Applied.SKIPPED
