"""Personal API tokens: created and revoked on the account page, sent as
`Authorization: Bearer <token>` to the JSON API and the MCP endpoint.

The token has 256 bits of randomness, so a plain SHA-256 is a safe way to store it (no
salt or slow hash needed: there is nothing to guess), and the lookup is one indexed query.
"""

import hashlib
import logging
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from queue_app import limits
from queue_app.models import ApiToken
from queue_app.services.errors import ServiceError

log = logging.getLogger(__name__)

TOKEN_PREFIX = "rsq_"
MAX_TOKENS_PER_USER = limits.API_TOKENS
# last_used_at is written at most this often, so a busy client does not write on every call
TOUCH_EVERY = timedelta(minutes=1)


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_create(*, user, name: str) -> tuple[ApiToken, str]:
    """A new token; the raw value is returned once and never stored."""
    name = (name or "").strip()[:100] or "token"
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        # the user's row, locked: two creates at once cannot both pass the count
        get_user_model().objects.select_for_update().filter(id=user.id).first()
        if ApiToken.objects.filter(owner=user).count() >= MAX_TOKENS_PER_USER:
            raise ServiceError(f"at most {MAX_TOKENS_PER_USER} tokens per account; revoke one first")
        token = ApiToken.objects.create(owner=user, name=name, prefix=raw[:12], token_hash=token_hash(raw))
    log.info("API token %s created by user %s", token.id, user.pk)
    return token, raw


def token_revoke(*, user, token_id) -> bool:
    deleted, _ = ApiToken.objects.filter(owner=user, id=token_id).delete()
    if deleted:
        log.info("API token %s revoked by user %s", token_id, user.pk)
    return bool(deleted)


def user_for_token(raw: str):
    """The active user a raw token belongs to, or None."""
    if not raw or not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    token = ApiToken.objects.select_related("owner").filter(token_hash=token_hash(raw)).first()
    if token is None or not token.owner.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or token.last_used_at < now - TOUCH_EVERY:
        ApiToken.objects.filter(id=token.id).update(last_used_at=now)
    return token.owner


def bearer(request) -> str | None:
    """The token of an `Authorization: Bearer …` header, if any."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None
