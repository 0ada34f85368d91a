"""Leases: which process is executing a processing job, and until when.

A claim writes a fresh lease token (transitions.job_claim); a worker that takes the
hand-off makes the lease its own (`lease_take`) and keeps it renewed from a side thread
(`LeaseKeeper`) while it works. None of this changes a job's status — that happens only
in `transitions` — so a lost lease is learnt from a renewal that matches no row.
"""

import logging
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


def lease_reissue(job_id, token, *, hold: timedelta) -> uuid.UUID | None:
    """A fresh lease token for work handed out again (a runner re-enqueues a submission or
    a download): the old task, if it still runs, is fenced out. Held for `hold` until a
    worker takes it. None when the job is no longer ours under `token`."""
    new_token = uuid.uuid4()
    if Job.objects.fenced(job_id, token).update(lease_token=new_token, lease_owner="", lease_expires_at=Now() + hold):
        return new_token
    return None


class LeaseKeeper:
    """Renews a job's lease every LEASE_RENEW_SECONDS from a side thread. `lost` is set
    when a renewal matches no row (the job was taken from us), or when no renewal has
    succeeded for LEASE_TTL_SECONDS - LEASE_RENEW_SECONDS (the database unreachable, as
    when this host is cut off): by then the lease may be over and another host rerunning
    the job. Either way `on_lost` is called, so the worker leaves the provider call
    rather than hold one slot twice at the provider."""

    def __init__(self, job_id, token, *, on_lost: Callable[[], None] | None = None):
        self.job_id, self.token = job_id, token
        self.lost = threading.Event()
        self.on_lost = on_lost
        # The lease was taken (or claimed) just before: its expiry counts from about now.
        self._started = self._confirmed = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{job_id}", daemon=True)
        self._watch = threading.Thread(target=self._watch_deadline, name=f"lease-watch-{job_id}", daemon=True)

    def __enter__(self):
        self._thread.start()
        self._watch.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        self._watch.join(timeout=5)

    def _lose(self, why: str) -> None:
        if self.lost.is_set():
            return
        self.lost.set()
        log.warning("job %s: %s; leaving the provider call", self.job_id, why)
        if self.on_lost is not None:
            self.on_lost()

    def _run(self):
        try:
            while not self._stop.wait(settings.LEASE_RENEW_SECONDS):
                sent = time.monotonic()  # the new expiry counts from no earlier than this
                try:
                    if not lease_renew(self.job_id, self.token):
                        self._lose("the lease was taken from this worker")
                        return
                    self._confirmed = sent
                except DatabaseError:
                    # Django never reopens a broken connection by itself: close it so the
                    # next renewal connects afresh, or the lease lapses under a live worker.
                    log.warning("lease renewal of job %s failed", self.job_id, exc_info=True)
                    connection.close()
        finally:
            connection.close()

    def _watch_deadline(self):
        """Apart from the renewals, which may hang on a database that went silent."""
        margin = max(settings.LEASE_TTL_SECONDS - settings.LEASE_RENEW_SECONDS, settings.LEASE_TTL_SECONDS / 2)
        while not self._stop.wait(min(0.5, settings.LEASE_RENEW_SECONDS / 2)):
            if self.lost.is_set():
                return
            if time.monotonic() - self._confirmed >= margin:
                self._lose(f"the lease could not be renewed for {margin:g} s")
                return


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
