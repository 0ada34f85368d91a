"""Idempotency keys: a repeated request with the same key gets the first answer back."""

import hashlib
import json
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from queue_app.models import IdempotencyKey
from queue_app.services.errors import ServiceError

IDEMPOTENCY_TTL = timedelta(hours=24)


class IdempotencyConflict(ServiceError):
    pass


def request_fingerprint(scope: str, body) -> str:
    return hashlib.sha256((scope + "\n" + json.dumps(body, sort_keys=True, default=str)).encode()).hexdigest()


def idempotent(*, user, key: str | None, scope: str, body, run):
    """Run `run()` -> (payload, status) once per (user, key).

    Same key and same request → the first response again; a different request → 422;
    the first request still running → 409. Keys are kept at least 24 hours.
    """
    if not key:
        return run()
    if len(key) > 200:
        raise ServiceError("Idempotency-Key is too long (200 characters at most)")
    fingerprint = request_fingerprint(scope, body)
    IdempotencyKey.objects.filter(owner=user, created_at__lt=timezone.now() - IDEMPOTENCY_TTL).delete()
    try:
        with transaction.atomic():
            record = IdempotencyKey.objects.create(owner=user, key=key, scope=scope, request_hash=fingerprint)
    except IntegrityError:
        existing = IdempotencyKey.objects.get(owner=user, key=key)
        if existing.request_hash != fingerprint:
            raise IdempotencyConflict(
                "this Idempotency-Key was used with a different request", 422, field="idempotency_key", reason="key_reused"
            ) from None
        if existing.status_code is None:
            raise IdempotencyConflict(
                "a request with this Idempotency-Key is still in progress", 409, reason="in_progress", retriable=True
            ) from None
        return existing.response, existing.status_code
    try:
        payload, status = run()
    except ServiceError as error:
        IdempotencyKey.objects.filter(id=record.id).delete()
        raise error
    except Exception:
        IdempotencyKey.objects.filter(id=record.id).delete()
        raise
    IdempotencyKey.objects.filter(id=record.id).update(response=payload, status_code=status)
    return payload, status
