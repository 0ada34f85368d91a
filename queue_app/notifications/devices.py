"""Devices: switching finish notifications on and off per browser, and the test send."""

import base64

from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from queue_app import limits
from queue_app.models import PushSubscription
from queue_app.notifications.outbox import Delivery, push_send
from queue_app.providers import net


def _b64decode(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


class BadSubscription(ValueError):
    pass


def subscription_save(*, user, endpoint: str, p256dh: str, auth: str, user_agent: str = "") -> PushSubscription:
    """Switch notifications on for one browser. The endpoint must pass the outbound guard
    (https, a public host); a browser that re-subscribes updates its row, and an endpoint
    that another account had on this browser moves to this one. At most
    limits.PUSH_SUBSCRIPTIONS per user: every finished project posts to each one."""
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
    with transaction.atomic():
        # the user's row, locked: two browsers subscribing at once cannot both pass the count
        get_user_model().objects.select_for_update().filter(id=user.id).first()
        others = PushSubscription.objects.filter(user=user).exclude(endpoint=endpoint).count()
        if others >= limits.PUSH_SUBSCRIPTIONS:
            raise BadSubscription(
                f"notifications are on for {others} browsers, the most one account may have: switch one off first"
            )
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
    if outcome == Delivery.SENT:
        PushSubscription.objects.filter(id=subscription.id).update(last_used_at=timezone.now())
    elif outcome == Delivery.GONE:
        subscription.delete()
    return outcome


test_send.__test__ = False  # not a pytest test, whatever its name
