"""Reference images of drafts: what a draft may name, and how an adapter gets the bytes.

A draft's `references` is a list of strings, each one of
- "ref:<sha256>"  an image its owner uploaded (a `Reference` row: one file per content);
- "album:<id>"    an image of its owner's album;
- an http(s) URL  fetched by the provider (or through the guarded client) when it runs.
A `data:` URI sent to the API is decoded, checked and stored like an upload, and the draft
keeps "ref:<sha256>": the page and the API share one validation (`normalize`).

The type of an uploaded image is read from its bytes (Pillow, as album files are), never
from the file name or the browser's claim; only PNG, JPEG, WebP and GIF are kept.
"""

import base64
import binascii
import io
import logging
import re

from PIL import Image

from queue_app.engine import media

log = logging.getLogger(__name__)

# The limits, declared once: the page, the API, MCP and the service all read these.
MAX_REFERENCES = 16
MAX_REFERENCE_BYTES = 20 * 1024 * 1024
MAX_URL_CHARS = 2048

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
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Exception:
        width = height = None
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
    from queue_app.models import AlbumItem, Reference

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


def load(value: str, owner_id: int) -> tuple[bytes, str] | None:
    """(bytes, content type) of a local reference (ref: or album:) of `owner_id`; None for
    anything else or a reference whose file is gone."""
    from queue_app.models import AlbumItem, Reference

    if value.startswith("ref:"):
        row = Reference.objects.filter(owner_id=owner_id, sha256=value[4:]).first()
        field, content_type = (row.file, row.content_type) if row else (None, "")
    elif value.startswith("album:") and value[6:].isdigit():
        item = AlbumItem.objects.filter(id=int(value[6:]), owner_id=owner_id).first()
        field, content_type = (item.file, item.content_type) if item else (None, "")
    else:
        return None
    if not field:
        return None
    try:
        with field.open("rb") as handle:
            return handle.read(), content_type
    except OSError:
        log.warning("reference file of %s is missing", value[:20])
        return None


def for_provider(values, owner_id: int) -> list[str]:
    """A draft's references as a provider takes them: local images as data: URIs (every
    adapter accepts those: OpenAI and Gemini decode them, Replicate, RunningHub and
    Civitai take them in place of a URL); URLs unchanged. A local reference whose file is
    gone stays as it is, and the adapter refuses it as an unusable reference."""
    resolved = []
    for value in values or []:
        found = load(value, owner_id)
        if found is None:
            resolved.append(value)
        else:
            data, content_type = found
            resolved.append(f"data:{content_type};base64,{base64.b64encode(data).decode()}")
    return resolved


def thumbnails(values) -> list[dict]:
    """What a draft row shows for each reference: a local image's thumbnail address, or a
    URL's host."""
    from django.urls import reverse

    shown = []
    for value in values or []:
        if value.startswith("ref:"):
            shown.append({"src": reverse("reference_file", args=[value[4:]]), "title": "uploaded image"})
        elif value.startswith("album:") and value[6:].isdigit():
            shown.append({"src": reverse("album_file", args=[int(value[6:])]), "title": "album image"})
        else:
            shown.append({"src": "", "title": value[:80]})
    return shown
