"""Opaque page cursors. Every list an agent reads pages by key (keyset), never by offset:
a row inserted or deleted between two pages neither repeats nor hides another one. The
cursor is the last row's key, base64 JSON; anything else is refused as not ours."""

import base64
import json
from datetime import datetime
from uuid import UUID

from queue_app.services.errors import ServiceError

MAX_ID = 2**63 - 1


def _encode(key: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, separators=(",", ":")).encode()).decode()


def _decode(cursor: str) -> dict:
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError, RecursionError):
        key = None
    if not isinstance(key, dict):
        raise not_ours()
    return key


def not_ours() -> ServiceError:
    return ServiceError("cursor: not a cursor this server gave", field="cursor")


def id_cursor(after: int) -> str:
    return _encode({"after": after})


def after_id(cursor: str | None) -> int:
    """The id a page starts after (0: the first page)."""
    if not cursor:
        return 0
    value = _decode(cursor).get("after")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise not_ours()
    return value


def time_cursor(created_at: datetime, row_id) -> str:
    return _encode({"t": created_at.isoformat(), "id": str(row_id)})


def after_time(cursor: str | None) -> tuple[datetime, UUID] | None:
    """(created_at, id) of the last row of the previous page, newest first (None: first)."""
    if not cursor:
        return None
    key = _decode(cursor)
    try:
        moment, row_id = datetime.fromisoformat(key["t"]), UUID(key["id"])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise not_ours() from None
    if moment.tzinfo is None:
        raise not_ours()
    return moment, row_id
