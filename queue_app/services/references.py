"""What a draft may name as a reference, checked once for the pages and the API.

A draft's `references` is a list of strings, each one of
- "ref:<sha256>"  an image its owner uploaded (a `Reference` row: one file per content,
                  album-independent: a form's files, POST /api/references, a data: URI);
- "album:<id>"    an image of its owner's album;
- an http(s) URL  fetched by the provider (or through the guarded client) when it runs.

Validation comes first, storing after: `normalize` checks every entry and returns a
`New` for each image not stored yet (a data: URI, a form's file); the draft services
store those (`storage.references_store_new`) only once the whole draft is valid, so a
refused draft leaves no file behind.

An image's type is read from its bytes (Pillow), never from its name: PNG, JPEG, WebP and
GIF only, none over limits.IMAGE_PIXELS.
"""

import base64
import binascii
import io
import re
from dataclasses import dataclass

from django.utils import timezone

from queue_app import limits
from queue_app.engine import media
from queue_app.models import AlbumItem, Reference
from queue_app.sizes import human_bytes

# The limits live in queue_app/limits.py with every other bound.
MAX_REFERENCES = limits.REFERENCES
MAX_REFERENCE_BYTES = limits.REFERENCE_BYTES
MAX_URL_CHARS = limits.REFERENCE_CHARS

IMAGE_TYPES = set(media.IMAGE_FORMATS.values())
_SHA = re.compile(r"^[0-9a-f]{64}$")
_DATA_URI = re.compile(r"^data:([\w.+/-]*)((?:;[\w=.-]+)*),(.*)$", re.S)
SNIFF_BYTES = 1024 * 1024  # what naming a refused file's type needs to read


class BadReference(ValueError):
    """A reference a draft cannot take; the message says why, for the user."""


@dataclass
class New:
    """An image checked and not stored yet: `source` is bytes or an uploaded file (read in
    chunks when stored, never whole in memory)."""

    source: object
    label: str
    content_type: str
    size: int
    width: int | None
    height: int | None
    sha256: str = ""  # filled in when stored


def _size_of(source) -> int:
    if isinstance(source, bytes | bytearray):
        return len(source)
    size = getattr(source, "size", None)
    if size is None:
        source.seek(0, io.SEEK_END)
        size = source.tell()
    return size


def checked(source, *, label: str = "the file") -> New:
    """An image read from its bytes (`source`: bytes or a file), checked and not stored;
    BadReference saying why not."""
    size = _size_of(source)
    if not size:
        raise BadReference(f"{label} is empty")
    if size > MAX_REFERENCE_BYTES:
        raise BadReference(f"{label} is {human_bytes(size)}; a reference image may be {human_bytes(MAX_REFERENCE_BYTES)}")
    if not isinstance(source, bytes | bytearray):
        source.seek(0)
    try:
        content_type, width, height = media.image_header(source)
    except media.NotMedia as error:
        raise BadReference(f"{label}: {error}") from None
    if content_type not in IMAGE_TYPES:
        raise BadReference(f"{label} is not an image (PNG, JPEG, WebP or GIF): {_what_it_is(source)}")
    return New(source, label, content_type, size, width, height)


def _what_it_is(source) -> str:
    if not isinstance(source, bytes | bytearray):
        source.seek(0)
        source = source.read(SNIFF_BYTES)
    try:
        return f"it is {media.sniff(source)}"
    except media.NotMedia as error:
        return str(error).replace("not a media file the album can show: ", "")


def image_facts(data: bytes, *, label: str = "the file") -> tuple[str, int | None, int | None]:
    """(content type, width, height) of an image read from its bytes, or BadReference."""
    new = checked(data, label=label)
    return new.content_type, new.width, new.height


def decode_data_uri(value: str) -> bytes:
    match = _DATA_URI.match(value)
    if not match:
        raise BadReference("a data: reference must look like data:image/png;base64,…")
    try:
        return base64.b64decode(match.group(3), validate=False) if ";base64" in match.group(2) else match.group(3).encode()
    except (binascii.Error, ValueError):
        raise BadReference("a data: reference is not valid base64") from None


def normalize(user, values, *, uploads=()) -> list:
    """The references a draft of `user` keeps, from what a form or a request gave, and the
    form's `uploads` after them: strings, and a `New` for each image to store.

    Nothing is stored here. An uploaded reference a draft names is marked used now, so the
    clean-up of unused uploads (`storage.references_prune`) leaves it be. Raises
    BadReference naming the first bad entry.
    """
    values = [] if values in (None, "") else values
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise BadReference("references must be a list of strings")
    if len(values) + len(uploads) > MAX_REFERENCES:
        raise BadReference(f"{len(values) + len(uploads)} references; a draft takes at most {MAX_REFERENCES}")
    kept = [_one(user, raw.strip(), f"reference {number}") for number, raw in enumerate(values, start=1)]
    for upload in uploads:
        kept.append(checked(upload, label=f"{getattr(upload, 'name', 'the file')[:60]!r}"))
    if sum(item.size for item in kept if isinstance(item, New)) > limits.UPLOAD_BYTES:
        raise BadReference(
            f"the new reference images add up to more than {human_bytes(limits.UPLOAD_BYTES)} in one request: "
            "add some, save, then add the rest (or upload them one by one through POST /api/references)"
        )
    return kept


def _one(user, value: str, label: str):
    if value.startswith("ref:"):
        sha = value[4:]
        found = _SHA.match(sha) and Reference.objects.filter(owner=user, sha256=sha).update(last_used_at=timezone.now())
        if not found:
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
        return checked(decode_data_uri(value), label=label)
    elif value.startswith(("https://", "http://")):
        if len(value) > MAX_URL_CHARS:
            raise BadReference(f"{label}: the URL is longer than {MAX_URL_CHARS} characters")
    else:
        raise BadReference(f"{label} must be ref:<sha256>, album:<id>, a data: URI or an http(s) URL")
    return value
