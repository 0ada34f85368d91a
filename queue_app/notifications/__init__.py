"""Finish notifications: Web Push to every device that switched notifications on.

A project *run* is a stretch of work: it opens when jobs of the project become pending
(`runs_touch`, called by `transitions.jobs_to_pending` in the same transaction) and is
closed exactly once, by a compare-and-set, when nothing of the project is pending or
processing and nothing started or finished for PUSH_SETTLE_SECONDS (a burst of
completions gives one notification). The closing transaction also records the counts,
emits the `project.finished` live event and writes one outbox row per device of the owner,
so a process that dies between the close and the send leaves the sends to the next one.

The queue service's notify step (`step`) does three things, each safe to run in any
number of processes at once:
1. open a run for projects that have work but no open run (a safety net: jobs started
   before this feature, or by a path that does not call `runs_touch`);
2. close the runs that have settled;
3. send due outbox rows: claim each with a short compare-and-set, send outside any
   transaction through pywebpush (its HTTP goes through queue_app.providers.net) on a few threads
   that the step does not wait for, then record the outcome under the claim. A 404/410
   from the push service means the device unsubscribed: its row goes.

Lock order (PostgreSQL): a run row before the project's event counter, both in
`runs_touch` (jobs_to_pending) and in `run_close`, so the two never deadlock.

A duplicate after a crash in the middle of an HTTP send is possible (at-least-once): the
claim is retaken SEND_CLAIM_SECONDS later (the send timeout and a margin), and the service
worker shows a run's notification once — a second copy with the same tag and run id is
dropped, so the user sees one alert.
"""

import base64
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from datetime import timedelta
from functools import lru_cache
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, Max, Min, OuterRef, Q
from django.utils import timezone
from py_vapid import Vapid02
from pywebpush import WebPushException, webpush

from queue_app.engine import events, failpoints
from queue_app.models import Job, Project, ProjectRun, PushOutbox, PushSubscription, Status, VapidKeys
from queue_app.providers import crypto, net

log = logging.getLogger(__name__)

ACTIVE = (Status.PENDING, Status.PROCESSING)
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


# --- VAPID keys ---------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _public_of(vapid: Vapid02) -> str:
    return _b64(vapid.public_key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint))


def _private_raw(vapid: Vapid02) -> str:
    return _b64(vapid.private_key.private_numbers().private_value.to_bytes(32, "big"))


@lru_cache(maxsize=4)
def _vapid(private_key: str) -> Vapid02:
    if private_key.lstrip().startswith("-----BEGIN"):
        return Vapid02.from_pem(private_key.encode())
    return Vapid02.from_string(private_key)


def vapid_keys() -> tuple[str, str]:
    """(public key, private key), both base64url: the public one is what browsers
    subscribe with (applicationServerKey), the private one signs our pushes."""
    if settings.VAPID_PRIVATE_KEY:
        private = settings.VAPID_PRIVATE_KEY
        public = _public_of(_vapid(private))
        if settings.VAPID_PUBLIC_KEY and settings.VAPID_PUBLIC_KEY.rstrip("=") != public:
            log.error("VAPID_PUBLIC_KEY does not belong to VAPID_PRIVATE_KEY; using the public key derived from the private one")
        return public, private
    row = VapidKeys.objects.filter(pk=1).first()
    if row is None:
        fresh = Vapid02()
        fresh.generate_keys()
        try:
            # get_or_create on the fixed primary key: of processes starting at once, one
            # inserts and the others read its pair (the unique key decides, not timing).
            row, _ = VapidKeys.objects.get_or_create(
                pk=1, defaults={"public_key": _public_of(fresh), "private_key_encrypted": crypto.encrypt(_private_raw(fresh))}
            )
        except IntegrityError:
            row = VapidKeys.objects.get(pk=1)
    return row.public_key, crypto.decrypt(row.private_key_encrypted)


# --- texts --------------------------------------------------------------------------------


def finish_text(*, total: int, completed: int, failed: int) -> str:
    if failed == 0:
        return "1 job finished." if total == 1 else f"All {total} jobs finished."
    if completed == 0:
        return "1 job failed." if failed == 1 else f"{failed} jobs failed."
    return f"{completed} of {total} jobs finished, {failed} failed."


def finish_payload(project: Project, run: ProjectRun) -> dict:
    return {
        "title": f"{project.name} is done",
        "body": finish_text(total=run.total, completed=run.completed, failed=run.failed),
        "url": f"/projects/{project.id}/",
        "tag": f"project-{project.id}",
        "project": project.id,
        "run": run.id,
        "total": run.total,
        "completed": run.completed,
        "failed": run.failed,
    }


# --- runs -----------------------------------------------------------------------------------


def runs_touch(*, project_ids, at) -> None:
    """Jobs of these projects became pending at `at`: open a run for each project that has
    none, or note the start on the open one. Call inside the transaction of the change.

    The UPDATE comes first on purpose: on PostgreSQL it waits for a `run_close` that holds
    the run's row, then finds the run closed and opens a new one — the new jobs are never
    left in a run that was just closed without them."""
    for project_id in sorted({pid for pid in project_ids if pid}):
        if ProjectRun.objects.filter(project_id=project_id, closed_at__isnull=True).update(last_started_at=at):
            continue
        # ON CONFLICT DO NOTHING against the one-open-run constraint: a concurrent opener wins.
        ProjectRun.objects.bulk_create(
            [ProjectRun(project_id=project_id, opened_at=at, last_started_at=at)], ignore_conflicts=True
        )


def runs_open_missing() -> int:
    """Safety net: a run for every project that has work but no open run."""
    open_run = ProjectRun.objects.filter(project_id=OuterRef("project_id"), closed_at__isnull=True)
    with_work = (
        Job.objects.filter(status__in=ACTIVE)
        .filter(~Exists(open_run))
        .order_by()
        .values("project_id")
        .annotate(first=Min("queued_at"))
    )
    opened = 0
    now = timezone.now()
    for row in with_work:
        at = row["first"] or now
        created = ProjectRun.objects.bulk_create(
            [ProjectRun(project_id=row["project_id"], opened_at=at, last_started_at=at)], ignore_conflicts=True
        )
        opened += len(created)
    return opened


def _run_state(run: ProjectRun) -> dict:
    """Active jobs of the project, and the counts and last finish of the run's jobs (those
    started since the run opened)."""
    in_run = Q(queued_at__gte=run.opened_at)
    return Job.objects.filter(project_id=run.project_id).aggregate(
        active=Count("id", filter=Q(status__in=ACTIVE)),
        completed=Count("id", filter=in_run & Q(status=Status.COMPLETED)),
        failed=Count("id", filter=in_run & Q(status=Status.FAILED)),
        last_finish=Max("finished_at", filter=in_run),
    )


def _settled(run: ProjectRun, state: dict, now) -> bool:
    if state["active"]:
        return False
    last = max(filter(None, [run.last_started_at, state["last_finish"]]))
    return now - last >= timedelta(seconds=settings.PUSH_SETTLE_SECONDS)


def run_close(run_id: int, *, now=None) -> bool:
    """Close a settled run once: the counts, the live event and the outbox rows commit
    together, so whoever wins the compare-and-set is the only one who notifies."""
    now = now or timezone.now()
    with transaction.atomic():
        # The row lock (PostgreSQL) orders us with a concurrent runs_touch; SQLite's
        # IMMEDIATE transaction already serialises writers.
        run = ProjectRun.objects.select_for_update().filter(id=run_id, closed_at__isnull=True).first()
        if run is None:
            return False
        state = _run_state(run)
        if not _settled(run, state, now):
            return False
        total = state["completed"] + state["failed"]
        if not ProjectRun.objects.filter(id=run.id, closed_at__isnull=True).update(
            closed_at=now, total=total, completed=state["completed"], failed=state["failed"]
        ):
            return False
        if total == 0:
            return True  # every job was unstarted again: nothing finished, nothing to say
        run.total, run.completed, run.failed, run.closed_at = total, state["completed"], state["failed"], now
        project = Project.objects.get(id=run.project_id)
        payload = finish_payload(project, run)
        events.emit(project.id, "project.finished", None, "", payload)
        PushOutbox.objects.bulk_create(
            [
                PushOutbox(run=run, subscription_id=sub_id, payload=payload, next_try_at=now)
                for sub_id in PushSubscription.objects.filter(user_id=project.owner_id).values_list("id", flat=True)
            ]
        )
    log.info("project %s finished: run %s, %s completed, %s failed", run.project_id, run.id, run.completed, run.failed)
    return True


def runs_close_settled(*, now=None) -> int:
    now = now or timezone.now()
    closed = 0
    for run in ProjectRun.objects.filter(closed_at__isnull=True):
        # A cheap read first; only a candidate takes the write transaction.
        if _settled(run, _run_state(run), now) and run_close(run.id, now=now):
            closed += 1
            failpoints.hit("push_after_close")
    if closed:
        outbox_prune(now=now)
    return closed


# --- sending --------------------------------------------------------------------------------


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
        return "failed", None
    private = private_key or vapid_keys()[1]
    topic = str(payload.get("tag", ""))[:32]
    try:
        webpush(
            {"endpoint": subscription.endpoint, "keys": {"p256dh": subscription.p256dh, "auth": subscription.auth}},
            data=json.dumps(payload),
            vapid_private_key=_vapid(private),
            vapid_claims={"sub": settings.VAPID_SUBJECT},
            timeout=SEND_TIMEOUT,
            ttl=TTL_SECONDS,
            headers={"Urgency": "normal", **({"Topic": topic} if topic else {})},
            requests_session=_NetSession(),
        )
    except WebPushException as error:
        status = error.response.status_code if error.response is not None else None
        if status in (404, 410):
            return "gone", None
        log.warning("push to subscription %s at %s failed: HTTP %s", subscription.id, host, status)
        if status == 429:
            from queue_app.providers.http_errors import retry_delay

            return "retry", retry_delay(error.response.headers)
        return ("retry" if status is None or status >= 500 else "failed"), None
    except Exception as error:  # network errors, timeouts, a bad key: never the endpoint's path
        log.warning("push to subscription %s at %s failed: %s", subscription.id, host, type(error).__name__)
        # requests' errors (connection, timeout) are OSErrors: worth another try
        return ("retry" if isinstance(error, OSError) else "failed"), None
    return "sent", None


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
    done = timezone.now()
    mine = PushOutbox.objects.filter(id=row.id, outcome="", claimed_until=until)
    if outcome == "sent":
        mine.update(outcome="sent", sent_at=done, claimed_until=None)
        PushSubscription.objects.filter(id=row.subscription_id).update(last_used_at=done)
    elif outcome == "gone":
        # The device unsubscribed (or its browser was reset): forget it, with its outbox.
        PushSubscription.objects.filter(id=row.subscription_id).delete()
        log.info("push subscription %s is gone; deleted", row.subscription_id)
    elif outcome == "retry" and row.attempts < SEND_MAX_ATTEMPTS:
        delay = min(RETRY_AFTER_CAP_SECONDS, retry_after) if retry_after else min(300, 5 * 2**row.attempts)
        mine.update(claimed_until=None, next_try_at=done + timedelta(seconds=delay))
    else:
        mine.update(outcome="failed", claimed_until=None)


def _send_and_record(row: PushOutbox, until, private_key: str) -> str:
    try:
        outcome, retry_after = _push(row.subscription, row.payload, private_key=private_key)
        outbox_record(row, outcome, until=until, retry_after=retry_after)
        return outcome
    except Exception:
        log.exception("push outbox row %s: sending failed", row.id)
        return "failed"
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
        ids, until = outbox_claim(now=now or timezone.now(), limit=free)
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
    did = runs_open_missing() + runs_close_settled(now=now)
    return did + (sender.step(now=now) if sender is not None else outbox_send_due(now=now))


# --- devices --------------------------------------------------------------------------------


def _b64decode(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


class BadSubscription(ValueError):
    pass


def subscription_save(*, user, endpoint: str, p256dh: str, auth: str, user_agent: str = "") -> PushSubscription:
    """Switch notifications on for one browser. The endpoint must pass the outbound guard
    (https, a public host); a browser that re-subscribes updates its row, and an endpoint
    that another account had on this browser moves to this one."""
    if not isinstance(endpoint, str) or len(endpoint) > 2048:
        raise BadSubscription("the subscription endpoint is missing or too long")
    try:
        net.check_url(endpoint)
    except net.UnsafeURL:
        raise BadSubscription("the push service address is not allowed")
    try:
        key, secret = _b64decode(p256dh), _b64decode(auth)
    except (ValueError, TypeError):
        raise BadSubscription("the subscription keys are not base64url")
    if len(key) != 65 or key[0] != 4 or len(secret) < 16 or len(p256dh) > 256 or len(auth) > 256:
        raise BadSubscription("the subscription keys have the wrong shape")
    try:  # a point on P-256, or every send to it fails in the encryption
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), key)
    except ValueError:
        raise BadSubscription("the subscription key is not a P-256 public key")
    subscription, _ = PushSubscription.objects.update_or_create(
        endpoint=endpoint, defaults={"user": user, "p256dh": p256dh, "auth": auth, "user_agent": user_agent[:300]}
    )
    return subscription


def subscription_delete(*, user, endpoint: str | None = None, subscription_id: int | None = None) -> int:
    mine = PushSubscription.objects.filter(user=user)
    if subscription_id is not None:
        return mine.filter(id=subscription_id).delete()[0]
    if endpoint:
        return mine.filter(endpoint=endpoint).delete()[0]
    return 0


def test_send(*, subscription: PushSubscription) -> str:
    """A test notification to one device, sent now (the preferences page's button)."""
    outcome = push_send(
        subscription,
        {
            "title": "Remix Studio Queue",
            "body": "Notifications are working. You will be notified when a project finishes its queue.",
            "url": "/account/preferences/",
            "tag": "push-test",
        },
    )
    if outcome == "sent":
        PushSubscription.objects.filter(id=subscription.id).update(last_used_at=timezone.now())
    elif outcome == "gone":
        subscription.delete()
    return outcome


test_send.__test__ = False  # not a pytest test, whatever its name
