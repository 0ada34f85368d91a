"""The bytes of a draft's references, for the adapters and the ComfyUI runner.

A draft's `references` is a list of strings: "ref:<sha256>" (an image its owner uploaded, a
`Reference` row), "album:<id>" (an image of its owner's album) or an http(s) URL fetched by
the provider. What a draft may name is checked by queue_app/services/references.py.
"""

import base64
import logging

from queue_app.models import AlbumItem, Reference

log = logging.getLogger(__name__)


def load(value: str, owner_id: int) -> tuple[bytes, str] | None:
    """(bytes, content type) of a local reference (ref: or album:) of `owner_id`; None for
    anything else or a reference whose file is gone."""
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
