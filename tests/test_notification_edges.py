"""Finish notifications at their edges (issue 18 §8).

- a subscription key that is not a point on P-256 is refused when subscribing (it used to
  be stored, and every send to it failed);
- a push service's Retry-After on 429 decides when the outbox row is tried again;
- a sender that dies mid-send leaves its rows to another sender once the send timeout
  (and a margin) has passed — not a fixed minute — while a live sender keeps them.
(The service worker's show-a-run-once rule, templates/account/sw.js, has no browser test yet.)
"""

import base64
from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.models import PushOutbox, PushSubscription
from queue_app.notifications import devices, outbox
from tests.conftest import make_project
from tests.fakes.push_service import Device, PushService

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def push_service(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]  # plain http to the loopback fake only
    with PushService() as service:
        yield service


def subscribe(user, service, name="phone"):
    device = Device(service.endpoint(name))
    info = device.subscription_info()
    return device, devices.subscription_save(user=user, endpoint=info["endpoint"], **info["keys"])


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_key_that_is_not_a_p256_point_is_refused(owner, push_service):
    device = Device(push_service.endpoint("phone"))
    keys = device.subscription_info()["keys"]
    off_curve = b"\x04" + b"\x01" * 64  # the right length and prefix, on no curve
    with pytest.raises(devices.BadSubscription, match="not a P-256 public key"):
        devices.subscription_save(user=owner, endpoint=device.endpoint, p256dh=b64(off_curve), auth=keys["auth"])
    assert not PushSubscription.objects.exists()


def outbox_row(owner, subscription):
    from queue_app.models import ProjectRun

    project = make_project(owner, name="Herons")
    now = timezone.now()
    run = ProjectRun.objects.create(project=project, opened_at=now, last_started_at=now, closed_at=now, total=1, completed=1)
    return PushOutbox.objects.create(run=run, subscription=subscription, payload={"title": "t", "tag": "x"}, next_try_at=now)


@pytest.mark.parametrize("retry_after, waits", [("120", 120), (None, None)], ids=["retry-after", "own-backoff"])
def test_a_429_with_retry_after_is_tried_again_when_the_push_service_said(owner, push_service, retry_after, waits):
    device, subscription = subscribe(owner, push_service)
    push_service.respond(device.endpoint, 429, {"Retry-After": retry_after} if retry_after else {})
    row = outbox_row(owner, subscription)
    before = timezone.now()
    outbox.outbox_send_due()
    row.refresh_from_db()
    assert row.outcome == "" and row.attempts == 1
    delay = (row.next_try_at - before).total_seconds()
    if waits:
        assert waits <= delay < waits + 5
    else:
        assert delay < 60  # our own backoff: 10 s after a first attempt


def test_a_claim_lasts_as_long_as_a_send_can_and_no_longer(owner, push_service):
    _, subscription = subscribe(owner, push_service)
    row = outbox_row(owner, subscription)
    now = timezone.now()
    send_limit = sum(outbox.SEND_TIMEOUT)
    assert outbox.outbox_claim(now=now)[0] == [row.id]
    # A sender still inside its timeouts keeps the row...
    assert outbox.outbox_claim(now=now + timedelta(seconds=send_limit))[0] == []
    # ...and one killed mid-send leaves it to another sender soon after, not a minute later.
    assert outbox.outbox_claim(now=now + timedelta(seconds=send_limit + 10))[0] == [row.id]
