"""What the album may hold: an output's media type, decided from its bytes.

A provider (or a ComfyUI instance) is a server its user chose: whatever it says a file is
(its Content-Type) is a claim, not a fact. A file announced as an image that is really
HTML would run script in the browser of whoever opens it from the album — staff included.
So the type is read from the bytes themselves — Pillow for images, puremagic's signatures
for video and audio — and only types the album can show are kept. SVG is not one of them:
it is an image that carries script.

The album serves these types inline (with nosniff and a sandboxing CSP); anything else an
older row may hold is served as an attachment (queue_app.web.album_files).
"""

import io
import warnings

import puremagic
from PIL import Image

from queue_app import limits

# The media types an album item may have, with the file extension it is stored under.
ALBUM_TYPES = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/webp": "webp",
    "image/gif": "gif",
    "video/mp4": "mp4",
    "video/webm": "webm",
    "video/quicktime": "mov",
    "audio/wav": "wav",
    "audio/mpeg": "mp3",
    "audio/mp4": "m4a",
    "audio/ogg": "ogg",
    "audio/flac": "flac",
    "text/plain": "txt",
}

IMAGE_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "MPO": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}

# puremagic names a match by extension (its MIME names vary: audio/wave, application/ogg…).
AV_EXTENSIONS = {
    ".mp4": "video/mp4",
    ".m4v": "video/mp4",
    ".webm": "video/webm",
    ".mov": "video/quicktime",
    ".wav": "audio/wav",
    ".mp3": "audio/mpeg",
    ".mpga": "audio/mpeg",
    ".m4a": "audio/mp4",
    ".ogg": "audio/ogg",
    ".oga": "audio/ogg",
    ".flac": "audio/flac",
}

# Named in a refusal so the reason reads well ("it looks like HTML").
LOOKS_LIKE = {"text/html": "HTML", "image/svg+xml": "SVG (an image that can carry script)", "application/pdf": "a PDF"}


class NotMedia(ValueError):
    """The bytes are not a media file the album can show."""


def image_header(source) -> tuple[str | None, int | None, int | None]:
    """(type, width, height) of an image from its header alone — `Image.open` is lazy, so
    nothing is decoded; (None, None, None) when Pillow does not read it as an image we
    keep. `source`: bytes, or a file opened for reading. NotMedia when the header claims
    more than limits.IMAGE_PIXELS: a tiny file can claim gigabytes of decoded pixels, and
    nothing of ours (poster, reference, album) decodes one that large."""
    handle = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own bound follows
            with Image.open(handle) as image:
                found, (width, height) = IMAGE_FORMATS.get(image.format or ""), image.size
    except Image.DecompressionBombError:
        found, width, height = "image", 10**6, 10**6  # past Pillow's own bound, so past ours
    except Exception:
        return None, None, None
    if width * height > limits.IMAGE_PIXELS:
        side = int(limits.IMAGE_PIXELS**0.5)
        raise NotMedia(f"an image of {width} × {height} pixels, more than the {side} × {side} images are allowed to have")
    return found, width, height


def image_type(data: bytes) -> str | None:
    """image/png, image/jpeg, image/webp or image/gif if Pillow reads `data` as one (from
    its header: NotMedia for one with too many pixels)."""
    return image_header(data)[0]


def _magic(data: bytes) -> list:
    try:
        return puremagic.magic_string(data[: 1024 * 1024])
    except Exception:  # PureError: nothing matched; anything else: not a file we know
        return []


def sniff(data: bytes, *, text_allowed: bool = False) -> str:
    """The album media type of `data`, read from its bytes; NotMedia with a readable reason
    for anything else. `text_allowed`: the output is meant to be text, so UTF-8 text with
    no file signature is kept as text/plain (served as plain text, never as a page)."""
    if not data:
        raise NotMedia("the file is empty")
    found = image_type(data)
    if found:
        return found
    matches = _magic(data)
    if matches:
        best = matches[0].confidence
        for match in matches:
            if match.confidence < best:
                break
            found = AV_EXTENSIONS.get((match.extension or "").lower())
            if found:
                return found
    if text_allowed and not matches:
        try:
            data.decode("utf-8")
            return "text/plain"
        except UnicodeDecodeError:
            pass
    named = next((LOOKS_LIKE.get(m.mime_type) for m in matches if LOOKS_LIKE.get(m.mime_type)), None)
    if named is None and data.lstrip()[:1] == b"<":
        named = "markup (HTML, SVG or XML)"
    detail = f"it looks like {named}" if named else "its type is not one the album shows (images, video, audio, text)"
    raise NotMedia(f"not a media file the album can show: {detail}")


def kind_of(content_type: str) -> str:
    """The album item kind of a media type (image, video, audio, text)."""
    family = content_type.split("/")[0]
    return "text" if family == "text" else family


def jpeg_poster(data: bytes) -> bytes | None:
    """A poster frame as JPEG (it is served as image/jpeg), or None if it is not an image
    or one too large to decode (a video keeps no poster then; it is not failed for it)."""
    try:
        found = image_type(data)
    except NotMedia:
        return None
    if found == "image/jpeg":
        return data
    if found is None:
        return None
    try:
        with Image.open(io.BytesIO(data)) as image:
            out = io.BytesIO()
            image.convert("RGB").save(out, format="JPEG", quality=85)
            return out.getvalue()
    except Exception:
        return None
