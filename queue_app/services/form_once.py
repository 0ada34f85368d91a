"""A page form's one-time token: the first POST that carries it runs, and a second one (a
double click, a reload after the POST, the back button and the same form sent again) gets
the first one's answer instead of doing the work twice.

The key is the token together with what was sent, so a form that is changed and sent again
(back, edit, send) is a new request; the same form sent twice is one. Rows live in the API's
idempotency table and are dropped after its 24 hours.
"""

import hashlib
import time

from django.db import IntegrityError, transaction
from django.utils import timezone

from queue_app.models import IdempotencyKey
from queue_app.services.idempotency import IDEMPOTENCY_TTL

SCOPE_PREFIX = "form:"
WAIT_SECONDS = 15.0
WAIT_STEP_SECONDS = 0.05


def form_key(token: str, fingerprint: str) -> str:
    return SCOPE_PREFIX + hashlib.sha256(f"{token}\n{fingerprint}".encode()).hexdigest()


def form_claim(*, user, token: str, fingerprint: str, scope: str) -> int | None:
    """The new row's id when this request is the first with its token and content; None
    when another request took it first."""
    IdempotencyKey.objects.filter(owner=user, created_at__lt=timezone.now() - IDEMPOTENCY_TTL).delete()
    try:
        with transaction.atomic():
            row = IdempotencyKey.objects.create(
                owner=user, key=form_key(token, fingerprint), scope=(SCOPE_PREFIX + scope)[:100], request_hash=fingerprint[:64]
            )
    except IntegrityError:
        return None
    return row.id


def form_finish(row_id: int, *, answer: dict, status: int) -> None:
    """Keep the first request's answer for the ones that repeat it."""
    IdempotencyKey.objects.filter(id=row_id).update(response=answer, status_code=status)


def form_release(row_id: int) -> None:
    """The first request did nothing worth repeating (a form error): the token is free again."""
    IdempotencyKey.objects.filter(id=row_id).delete()


def form_answer(*, user, token: str, fingerprint: str, wait: float = WAIT_SECONDS) -> dict | None:
    """The first request's answer, waiting while it runs (a double click's second request
    comes while the first still works); None when it failed or is still running after
    `wait` seconds."""
    key = form_key(token, fingerprint)
    deadline = time.monotonic() + wait
    while True:
        row = IdempotencyKey.objects.filter(owner=user, key=key).values("response", "status_code").first()
        if row is None:
            return None  # released: the first one failed
        if row["status_code"] is not None:
            return row["response"]
        if time.monotonic() >= deadline:
            return None
        time.sleep(WAIT_STEP_SECONDS)
