"""What a draft may name as a reference, checked once for the pages and the API.

A draft's `references` is a list of strings, each one of
- "ref:<sha256>"  an image its owner uploaded (a `Reference` row: one file per content);
- "album:<id>"    an image of its owner's album;
- an http(s) URL  fetched by the provider (or through the guarded client) when it runs.
A `data:` URI sent to the API is decoded, checked and stored like an upload, and the draft
keeps "ref:<sha256>" (`normalize`).

The type of an uploaded image is read from its bytes (Pillow, as album files are), never
from the file name or the browser's claim; only PNG, JPEG, WebP and GIF are kept.
"""

import base64
import binascii
import re

from queue_app import limits
from queue_app.engine import media
from queue_app.models import AlbumItem, Reference

# The limits live in queue_app/limits.py with every other bound.
MAX_REFERENCES = limits.REFERENCES
MAX_REFERENCE_BYTES = limits.REFERENCE_BYTES
MAX_URL_CHARS = limits.REFERENCE_CHARS

IMAGE_TYPES = set(media.IMAGE_FORMATS.values())
_SHA = re.compile(r"^[0-9a-f]{64}$")
_DATA_URI = re.compile(r"^data:([\w.+/-]*)((?:;[\w=.-]+)*),(.*)$", re.S)


class BadReference(ValueError):
    """A reference a draft cannot take; the message says why, for the user."""


def image_facts(data: bytes, *, label: str = "the file") -> tuple[str, int | None, int | None]:
    """(content type, width, height) of an image read from its bytes, or BadReference."""
    if not data:
        raise BadReference(f"{label} is empty")
    if len(data) > MAX_REFERENCE_BYTES:
        raise BadReference(f"{label} is {len(data) / 1e6:.1f} MB; a reference image may be {MAX_REFERENCE_BYTES / 1e6:.0f} MB")
    try:
        content_type = media.image_type(data)
    except media.NotMedia as error:
        raise BadReference(f"{label}: {error}") from None
    if content_type not in IMAGE_TYPES:
        try:
            found = media.sniff(data)
            detail = f"it is {found}"
        except media.NotMedia as error:
            detail = str(error).replace("not a media file the album can show: ", "")
        raise BadReference(f"{label} is not an image (PNG, JPEG, WebP or GIF): {detail}")
    _, width, height = media.image_header(data)
    return content_type, width, height


def decode_data_uri(value: str) -> bytes:
    match = _DATA_URI.match(value)
    if not match:
        raise BadReference("a data: reference must look like data:image/png;base64,…")
    try:
        return base64.b64decode(match.group(3), validate=False) if ";base64" in match.group(2) else match.group(3).encode()
    except (binascii.Error, ValueError):
        raise BadReference("a data: reference is not valid base64") from None


def normalize(user, values, *, store) -> list[str]:
    """The references a draft of `user` keeps, from what a form or a request gave.

    `store(user, data) -> sha256` keeps an inline image (a data: URI) as an upload.
    Raises BadReference naming the first bad entry; nothing is stored for a refused list
    unless it was itself valid (storing is idempotent by content).
    """
    if values in (None, ""):
        return []
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise BadReference("references must be a list of strings")
    if len(values) > MAX_REFERENCES:
        raise BadReference(f"{len(values)} references; a draft takes at most {MAX_REFERENCES}")
    kept = []
    for number, raw in enumerate(values, start=1):
        value = raw.strip()
        label = f"reference {number}"
        if value.startswith("ref:"):
            sha = value[4:]
            if not _SHA.match(sha) or not Reference.objects.filter(owner=user, sha256=sha).exists():
                raise BadReference(f"{label}: no uploaded image {value[:20]!r} in this account")
        elif value.startswith("album:"):
            item_id = value[6:]
            valid_id = item_id.isdigit() and len(item_id) < 19
            item = AlbumItem.objects.filter(id=int(item_id), owner=user).first() if valid_id else None
            if item is None or not item.file:
                raise BadReference(f"{label}: {value!r} is not an album item of this account")
            if item.kind != AlbumItem.ItemKind.IMAGE:
                raise BadReference(f"{label}: album item {item_id} is a {item.kind}, not an image")
        elif value.startswith("data:"):
            value = "ref:" + store(user, decode_data_uri(value), label=label)
        elif value.startswith(("https://", "http://")):
            if len(value) > MAX_URL_CHARS:
                raise BadReference(f"{label}: the URL is longer than {MAX_URL_CHARS} characters")
        else:
            raise BadReference(f"{label} must be ref:<sha256>, album:<id>, a data: URI or an http(s) URL")
        kept.append(value)
    return kept
