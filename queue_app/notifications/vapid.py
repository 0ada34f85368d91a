"""VAPID keys: the pair that signs our pushes — from the settings, or generated once and
kept (the private half encrypted) in the database."""

import base64
import logging
from functools import lru_cache

from cryptography.hazmat.primitives import serialization
from django.conf import settings
from django.db import IntegrityError
from py_vapid import Vapid02

from queue_app.models import VapidKeys
from queue_app.providers import crypto

log = logging.getLogger(__name__)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _public_of(vapid: Vapid02) -> str:
    return _b64(vapid.public_key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint))


def _private_raw(vapid: Vapid02) -> str:
    return _b64(vapid.private_key.private_numbers().private_value.to_bytes(32, "big"))


@lru_cache(maxsize=4)
def vapid_signer(private_key: str) -> Vapid02:
    if private_key.lstrip().startswith("-----BEGIN"):
        return Vapid02.from_pem(private_key.encode())
    return Vapid02.from_string(private_key)


def vapid_keys() -> tuple[str, str]:
    """(public key, private key), both base64url: the public one is what browsers
    subscribe with (applicationServerKey), the private one signs our pushes."""
    if settings.VAPID_PRIVATE_KEY:
        private = settings.VAPID_PRIVATE_KEY
        public = _public_of(vapid_signer(private))
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
