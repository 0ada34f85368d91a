"""Leases: which process is executing a processing job, and until when.

A claim writes a fresh lease token (transitions.jobs_claim); a worker that takes the
hand-off makes the lease its own (`lease_take`) and keeps it renewed from a side thread
(`LeaseKeeper`) while it works. None of this changes a job's status — that happens only
in `transitions` — so a lost lease is learnt from a renewal that matches no row.
"""

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.db.models.functions import Now

from queue_app.models import Job

log = logging.getLogger(__name__)

T = TypeVar("T")


def lease_expiry(seconds: float | None = None):
    return Now() + timedelta(seconds=seconds if seconds is not None else settings.LEASE_TTL_SECONDS)


def lease_take(job_id, token, *, owner: str) -> bool:
    """A worker starts executing a claimed job: the lease becomes its own. Only a hand-off
    nobody has taken yet (empty owner): a task delivered twice runs once, and a job whose
    taker died waits for healing to hand it out again under a new token."""
    return bool(
        Job.objects.fenced(job_id, token).filter(lease_owner="").update(lease_owner=owner, lease_expires_at=lease_expiry())
    )


def lease_renew(job_id, token) -> bool:
    """Extend a running job's lease; False means the job is no longer ours."""
    return bool(Job.objects.fenced(job_id, token).update(lease_expires_at=lease_expiry()))


def lease_reissue(job_id, token, *, hold: timedelta, if_over: bool = False) -> uuid.UUID | None:
    """A fresh lease token for work handed out again (a runner re-enqueues a submission or
    a download): the old task, if it still runs, is fenced out. Held for `hold` until a
    worker takes it. None when the job is no longer ours under `token`. `if_over`: only
    when the lease has ended by the database's clock, for a caller that read it ended a
    while ago: a worker that took the job since (its lease renewed, the token the same)
    keeps it, instead of running beside the one handed out."""
    new_token = uuid.uuid4()
    jobs = Job.objects.fenced(job_id, token)
    if if_over:
        jobs = jobs.filter(lease_expires_at__lte=Now())
    if jobs.update(lease_token=new_token, lease_owner="", lease_expires_at=Now() + hold):
        return new_token
    return None


class LeaseKeeper:
    """Keeps a job's lease renewed every LEASE_RENEW_SECONDS while its worker works. `lost`
    is set when a renewal matches no row (the job was taken from us), or when no renewal
    has succeeded for LEASE_TTL_SECONDS - LEASE_RENEW_SECONDS (the database unreachable, as
    when this host is cut off): by then the lease may be over and another host rerunning
    the job. Either way `on_lost` is called, so the worker leaves the provider call rather
    than hold one slot twice at the provider.

    The renewals and the deadline watch run on two threads of the process, shared by all
    its keepers (`_keepers`): entering and leaving a keeper is a dictionary change, not two
    thread starts and joins per job, which under load each waited for the scheduler."""

    def __init__(self, job_id, token, *, on_lost: Callable[[], None] | None = None):
        self.job_id, self.token = job_id, token
        self.lost = threading.Event()
        self.on_lost = on_lost
        self._active = False
        # The lease was taken (or claimed) just before: its expiry counts from about now.
        self._started = self._confirmed = self._sent = time.monotonic()

    def __enter__(self):
        self._started = self._confirmed = self._sent = time.monotonic()
        _keepers.add(self)
        return self

    def __exit__(self, *exc):
        _keepers.remove(self)

    def _lose(self, why: str) -> None:
        with _keepers.lock:
            if self.lost.is_set() or not self._active:
                return  # lost already, or the worker is done with the job
            self.lost.set()
        log.warning("job %s: %s; leaving the provider call", self.job_id, why)
        if self.on_lost is not None:
            self.on_lost()


class _Keepers:
    """This process's running leases, renewed by one thread and watched by another. The
    threads start with the first keeper in each process (django-q2 forks its workers: a
    parent's threads do not exist in the child). The renewer's database connection is
    closed whenever no lease is held, so none outlives the work (tests drop their
    database; a worker between jobs holds no idle connection for it)."""

    def __init__(self):
        self._forked()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # A lock another thread held at the fork would stay held in the child.
        self.lock = threading.Lock()
        self._held: dict[int, LeaseKeeper] = {}
        self._pid = None
        self._wake = threading.Event()

    def add(self, keeper: LeaseKeeper) -> None:
        with self.lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._renew, args=(self._wake,), name="lease-renewer", daemon=True).start()
                threading.Thread(target=self._watch, name="lease-watch", daemon=True).start()
            keeper._active = True
            self._held[id(keeper)] = keeper

    def remove(self, keeper: LeaseKeeper) -> None:
        with self.lock:
            keeper._active = False
            self._held.pop(id(keeper), None)
            if not self._held:
                self._wake.set()  # the renewer closes its connection now

    def _snapshot(self) -> list[LeaseKeeper]:
        with self.lock:
            return list(self._held.values())

    @staticmethod
    def _tick() -> float:
        return min(0.5, settings.LEASE_RENEW_SECONDS / 2)

    def _renew(self, wake: threading.Event) -> None:
        # Every job of the process depends on this thread: nothing may end it.
        while True:
            wake.wait(self._tick())
            wake.clear()
            held = self._snapshot()
            if not held:
                connection.close()
                continue
            for keeper in held:
                try:
                    self._renew_one(keeper)
                except Exception:
                    log.exception("lease renewal of job %s failed", keeper.job_id)

    def _renew_one(self, keeper: LeaseKeeper) -> None:
        sent = time.monotonic()  # the new expiry counts from no earlier than this
        if sent - keeper._sent < settings.LEASE_RENEW_SECONDS or keeper.lost.is_set():
            return
        keeper._sent = sent
        try:
            if not lease_renew(keeper.job_id, keeper.token):
                keeper._lose("the lease was taken from this worker")
                return
            keeper._confirmed = sent
        except DatabaseError:
            # Django never reopens a broken connection by itself: close it so the next
            # renewal connects afresh, or the lease lapses under a live worker.
            log.warning("lease renewal of job %s failed", keeper.job_id, exc_info=True)
            connection.close()

    def _watch(self) -> None:
        """Apart from the renewals, which may hang on a database that went silent."""
        while True:
            time.sleep(self._tick())
            margin = max(settings.LEASE_TTL_SECONDS - settings.LEASE_RENEW_SECONDS, settings.LEASE_TTL_SECONDS / 2)
            now = time.monotonic()
            for keeper in self._snapshot():
                if now - keeper._confirmed >= margin:
                    try:
                        keeper._lose(f"the lease could not be renewed for {margin:g} s")
                    except Exception:
                        log.exception("leaving job %s's provider call failed", keeper.job_id)


_keepers = _Keepers()


def leave_to_healing(job_id, doing: str) -> None:
    """A worker step whose database connection broke (the database restarted, the backend
    was killed): do not limp on. The connection is closed so the next task connects afresh;
    the job's lease runs out and it is handed out again (healing, or the ComfyUI check)."""
    log.error("database error while %s job %s; leaving it to healing", doing, job_id, exc_info=True)
    connection.close()


def reconnecting_once(job_id, apply: Callable[[], T]) -> T:
    """The provider has answered, and may have billed: a connection that broke meanwhile (a
    database restart, a killed backend) must not lose that answer to healing, which would
    send the job again. Reconnect once and `apply()` it again; every write is fenced by the
    lease token, so one that did commit before the break is not applied twice."""
    try:
        return apply()
    except (OperationalError, InterfaceError) as error:
        log.warning("job %s: database error while recording the provider's answer (%s); reconnecting once", job_id, error)
        connection.close()
        return apply()
