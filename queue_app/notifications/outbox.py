"""Sending finish notifications: the outbox rows a run's close wrote (engine/project_runs.py)
go out through Web Push on the queue service's notify step.

The step (`step`), safe in any number of processes, opens runs for projects with work and
none open (a safety net), closes the runs that settled, and sends due rows: each claimed
by a short compare-and-set, sent outside any transaction (through queue_app.providers.net)
on a few threads the step does not wait for, its outcome recorded under the claim. A
404/410 means the device unsubscribed: its row goes. A crash mid-send can send twice (the
claim is retaken SEND_CLAIM_SECONDS later); the service worker shows a run's notification
once, so the user sees one alert.
"""

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from datetime import timedelta
from enum import StrEnum
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone
from pywebpush import WebPushException, webpush

from queue_app.engine import project_runs
from queue_app.engine.clock import db_now
from queue_app.models import PushOutbox, PushSubscription
from queue_app.notifications.vapid import vapid_keys, vapid_signer
from queue_app.providers import net

log = logging.getLogger(__name__)

# A push message waits this long at the push service for a device that is offline.
TTL_SECONDS = 12 * 3600
SEND_TIMEOUT = (5, 10)
# A claim outlives the longest a send can take (connect + read timeouts, and a margin for
# the encryption and the write): a sender killed mid-send leaves its rows to another one
# this long after, not a minute later. (A push service may have delivered the first copy:
# the service worker shows a run's notification once.)
SEND_CLAIM_SECONDS = sum(SEND_TIMEOUT) + 5
# A push service's Retry-After is honoured up to this long.
RETRY_AFTER_CAP_SECONDS = 3600
SEND_MAX_ATTEMPTS = 5
SEND_PARALLELISM = 4
SEND_BATCH = 50
# Sent outbox rows are kept this long (what was sent, for support), then pruned.
OUTBOX_RETENTION = timedelta(days=7)


class Delivery(StrEnum):
    """What one send did (push_send); an outbox row records SENT or FAILED ("" while due)."""

    SENT = "sent"
    GONE = "gone"  # 404/410: the device unsubscribed
    RETRY = "retry"  # network, 429, 5xx: worth another try
    FAILED = "failed"  # anything else: a bad endpoint or request


class _NetSession:
    """What pywebpush needs of a requests session (`post`), routed through queue_app.providers.net:
    the SSRF guard on the endpoint, explicit timeouts, a capped response, no redirects."""

    def post(self, url, *, data=None, headers=None, timeout=None):
        return net.request(
            "POST", url, data=data, headers=dict(headers or {}), timeout=timeout or SEND_TIMEOUT, max_bytes=64 * 1024
        )


def endpoint_host(endpoint: str) -> str:
    """What logs and pages may show of an endpoint: its host. The path is the secret."""
    try:
        return urlsplit(endpoint).hostname or "?"
    except ValueError:
        return "?"


def push_send(subscription: PushSubscription, payload: dict, *, private_key: str | None = None) -> str:
    """Send one message to one device. Returns sent | gone (404/410: unsubscribed) |
    retry (network, 429, 5xx) | failed (anything else: a bad endpoint or request)."""
    return _push(subscription, payload, private_key=private_key)[0]


def _push(subscription: PushSubscription, payload: dict, *, private_key: str | None = None) -> tuple[str, float | None]:
    """push_send's outcome, and the push service's Retry-After (seconds) on a 429."""
    host = endpoint_host(subscription.endpoint)
    try:
        net.check_url(subscription.endpoint)
    except net.UnsafeURL as error:
        log.warning("push to subscription %s refused: %s", subscription.id, str(error).replace(subscription.endpoint, host))
        return Delivery.FAILED, None
    private = private_key or vapid_keys()[1]
    topic = str(payload.get("tag", ""))[:32]
    try:
        webpush(
            {"endpoint": subscription.endpoint, "keys": {"p256dh": subscription.p256dh, "auth": subscription.auth}},
            data=json.dumps(payload),
            vapid_private_key=vapid_signer(private),
            vapid_claims={"sub": settings.VAPID_SUBJECT},
            timeout=SEND_TIMEOUT,
            ttl=TTL_SECONDS,
            headers={"Urgency": "normal", **({"Topic": topic} if topic else {})},
            requests_session=_NetSession(),
        )
    except WebPushException as error:
        status = error.response.status_code if error.response is not None else None
        if status in (404, 410):
            return Delivery.GONE, None
        log.warning("push to subscription %s at %s failed: HTTP %s", subscription.id, host, status)
        if status == 429:
            from queue_app.providers.http_errors import retry_delay

            return Delivery.RETRY, retry_delay(error.response.headers)
        return (Delivery.RETRY if status is None or status >= 500 else Delivery.FAILED), None
    except Exception as error:  # network errors, timeouts, a bad key: never the endpoint's path
        log.warning("push to subscription %s at %s failed: %s", subscription.id, host, type(error).__name__)
        # requests' errors (connection, timeout) are OSErrors: worth another try
        return (Delivery.RETRY if isinstance(error, OSError) else Delivery.FAILED), None
    return Delivery.SENT, None


def outbox_claim(*, now, limit: int = SEND_BATCH) -> tuple[list[int], object]:
    """Claim due outbox rows with a compare-and-set on their old claim. Returns the ids and
    the claim's expiry, which every later write of this sender filters on."""
    until = now + timedelta(seconds=SEND_CLAIM_SECONDS)
    due = (
        PushOutbox.objects.filter(outcome="", next_try_at__lte=now)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .order_by("next_try_at", "id")
        .values_list("id", "claimed_until", "attempts")[:limit]
    )
    claimed = []
    for row_id, old_claim, attempts in due:
        if PushOutbox.objects.filter(id=row_id, outcome="", claimed_until=old_claim, attempts=attempts).update(
            claimed_until=until, attempts=attempts + 1
        ):
            claimed.append(row_id)
    return claimed, until


def outbox_record(row: PushOutbox, outcome: str, *, until, retry_after: float | None = None) -> None:
    """Write a send's outcome, only while our claim holds (a sender whose claim expired and
    was taken over writes nothing). A retry waits the push service's Retry-After when it
    gave one (up to an hour), else our own backoff."""
    # The database's clock: the retry's due time is compared by every host's sender.
    done = Now()
    mine = PushOutbox.objects.filter(id=row.id, outcome="", claimed_until=until)
    if outcome == Delivery.SENT:
        mine.update(outcome=Delivery.SENT, sent_at=done, claimed_until=None)
        PushSubscription.objects.filter(id=row.subscription_id).update(last_used_at=done)
    elif outcome == Delivery.GONE:
        # The device unsubscribed (or its browser was reset): forget it, with its outbox.
        PushSubscription.objects.filter(id=row.subscription_id).delete()
        log.info("push subscription %s is gone; deleted", row.subscription_id)
    elif outcome == Delivery.RETRY and row.attempts < SEND_MAX_ATTEMPTS:
        delay = min(RETRY_AFTER_CAP_SECONDS, retry_after) if retry_after else min(300, 5 * 2**row.attempts)
        mine.update(claimed_until=None, next_try_at=done + timedelta(seconds=delay))
    else:
        mine.update(outcome=Delivery.FAILED, claimed_until=None)


def _send_and_record(row: PushOutbox, until, private_key: str) -> str:
    try:
        outcome, retry_after = _push(row.subscription, row.payload, private_key=private_key)
        outbox_record(row, outcome, until=until, retry_after=retry_after)
        return outcome
    except Exception:
        log.exception("push outbox row %s: sending failed", row.id)
        return Delivery.FAILED
    finally:
        connection.close()  # this pool thread's own connection


class Sender:
    """The queue service's push sender: a few threads that a step fills without waiting
    for them, so a push service that hangs (up to the timeouts) never holds up the loop."""

    def __init__(self, parallelism: int = SEND_PARALLELISM):
        self.parallelism = parallelism
        self.pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="push")
        self.futures: set = set()

    def step(self, *, now=None) -> int:
        self.futures = {future for future in self.futures if not future.done()}
        free = self.parallelism - len(self.futures)
        if free <= 0:
            return 0
        # Claims are compared by every host's sender: a host whose clock runs ahead would
        # take a live sender's rows early and push them twice.
        ids, until = outbox_claim(now=now or db_now(), limit=free)
        if not ids:
            return 0
        private_key = vapid_keys()[1]  # read (or created) here, once, not by every thread
        for row in PushOutbox.objects.filter(id__in=ids).select_related("subscription"):
            self.futures.add(self.pool.submit(_send_and_record, row, until, private_key))
        return len(ids)

    def drain(self, timeout: float = 60) -> None:
        wait_for_futures(self.futures, timeout=timeout)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def outbox_send_due(*, now=None) -> int:
    """Send what is due and wait for the sends (one-off use and tests)."""
    sender, sent = Sender(), 0
    try:
        while sent < SEND_BATCH:
            started = sender.step(now=now)
            sender.drain()
            if not started:
                break
            sent += started
    finally:
        sender.close()
    return sent


def outbox_prune(*, now=None) -> int:
    now = now or timezone.now()
    deleted, _ = PushOutbox.objects.exclude(outcome="").filter(created_at__lt=now - OUTBOX_RETENTION).delete()
    return deleted


def step(*, now=None, sender: Sender | None = None) -> int:
    """The queue service's notify step. Returns how many things it did. With a `sender`
    the sends are started and not waited for; without one they complete before it returns."""
    did = project_runs.runs_open_missing()
    closed = project_runs.runs_close_settled(now=now)
    if closed:
        outbox_prune(now=now)
    did += closed
    return did + (sender.step(now=now) if sender is not None else outbox_send_due(now=now))
