"""What every adapter does the same way: send a request through the guarded client and
turn what went wrong into one of the three errors.

- transport: a failure before the request was sent (net's NotSent: refused, DNS, TLS,
  connect timeout) is transient; after it was sent (read timeout, reset) a create call
  is ambiguous (the provider may have accepted it), a status check is transient;
- HTTP status: 401 an account problem (the key); 408/409/425/429/5xx transient (502/504
  on a create call ambiguous: a gateway may have passed it on), other 4xx permanent —
  adapters look at the body first for the cases that break this rule (OpenAI's
  `insufficient_quota` 429, Gemini's 400 bad key);
- delay hints: `retry-after-ms`, `Retry-After` (seconds or an HTTP date), parsed here;
  Gemini's RetryInfo lives in its adapter.
Plus small helpers the adapters share: JSON bodies, references, content types, layers.
"""

import base64
import binascii
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote, urlsplit

import requests

from queue_app import limits
from queue_app.providers import net
from queue_app.providers.base import (
    AccountError,
    AmbiguousError,
    Output,
    PermanentError,
    ProviderError,
    ResolvedJob,
    TransientError,
)
from queue_app.providers.transport_errors import NotSent

# A create call may block while the provider generates (OpenAI images: tens of seconds).
CREATE_TIMEOUT = (10, 300)
# A status check is small and must finish well inside the poller's claim (120 s).
CHECK_TIMEOUT = (10, 30)
# A reference image fetched to send inline: the bound of an uploaded one.
MAX_REFERENCE_BYTES = limits.REFERENCE_BYTES
# A layer-decomposition result: one composite and at most this many layers.
MAX_LAYERS = 16

TRANSIENT_STATUSES = {408, 409, 425, 429, 500, 502, 503, 504}


def send(method: str, url: str, *, create: bool, label: str, timeout=None, **kwargs) -> requests.Response:
    """One request through the guarded client; transport failures become our errors.
    `create` marks a call that starts (and may bill) work: it is never re-sent here. One
    that was never written (net's NotSent: refused, unresolved, TLS, connect timeout) is
    transient on every call; one that failed after it was written is ambiguous on a create
    call (the provider may have accepted it), transient on a check."""
    timeout = timeout or (CREATE_TIMEOUT if create else CHECK_TIMEOUT)
    try:
        return net.request(method, url, timeout=timeout, **kwargs)
    except net.UnsafeURL as exc:
        raise PermanentError(f"{label}: refused to call {urlsplit(url).netloc or url[:60]!r}: {exc}") from None
    except net.TooLarge as exc:
        raise PermanentError(f"{label}: {exc}") from None
    except NotSent as exc:
        raise TransientError(f"{label}: could not connect ({exc.cause}); nothing was sent") from None
    except requests.exceptions.InvalidURL as exc:
        raise PermanentError(f"{label}: not a URL that can be called ({type(exc).__name__})") from None
    except requests.RequestException as exc:
        kind = type(exc).__name__
        if create:
            raise AmbiguousError(f"{label}: the connection failed after the request was sent ({kind}); it may have been accepted")
        raise TransientError(f"{label}: request failed ({kind})") from None


def retry_delay(headers, *, now: datetime | None = None) -> float | None:
    """The server's own delay hint in seconds: `retry-after-ms`, then `Retry-After`."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def error_for_status(status: int, message: str, *, create: bool, delay: float | None = None) -> ProviderError:
    """The generic mapping of an HTTP error status (after the adapter's own exceptions)."""
    if status == 401:
        # The key, not the job: every request would fail alike (an account problem).
        return AccountError(f"{message} — the provider rejected the API key")
    if create and status in (502, 504):
        return AmbiguousError(f"{message} (a gateway error on a create call: the request may have been accepted)")
    if status in TRANSIENT_STATUSES or status >= 500:
        return TransientError(message, delay=delay)
    return PermanentError(message)


def json_body(response: requests.Response, *, create: bool, label: str) -> dict:
    """The response's JSON object. A 2xx body that is not one: the create call may have
    been accepted (ambiguous); a check simply failed (transient)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    message = f"{label}: HTTP {response.status_code} with a body that is not a JSON object"
    if create and response.status_code < 400:
        raise AmbiguousError(message + "; the request may have been accepted")
    raise TransientError(message)


def error_body(response: requests.Response) -> dict:
    """An error response's JSON object, or {} (HTML from a proxy, empty bodies)."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def short(text, limit: int = 300) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def segment(task_id: str) -> str:
    """A task id as one URL path segment: it came from a remote server, so it must not be
    able to walk the path (`../`) or add a query."""
    if not task_id or len(task_id) > 500:
        raise PermanentError(f"unusable task id {task_id[:40]!r}")
    return quote(task_id, safe="")


# --- References (input images) ------------------------------------------------------

_DATA_URI = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?(;[^,]*)?,(.*)$", re.DOTALL)


def reference_bytes(reference: str, *, label: str) -> tuple[bytes, str]:
    """A reference as (bytes, content type): a `data:` URI decoded, a URL fetched through
    the guarded client (so a reference cannot point at the metadata service)."""
    match = _DATA_URI.match(reference or "")
    if match:
        content_type = match.group(1) or "application/octet-stream"
        try:
            return base64.b64decode(match.group(3), validate=False), content_type
        except (binascii.Error, ValueError):
            raise PermanentError(f"{label}: a reference image is not valid base64") from None
    try:
        data, content_type = net.download(reference, max_bytes=MAX_REFERENCE_BYTES)
    except (net.UnsafeURL, net.TooLarge) as exc:
        raise PermanentError(f"{label}: reference image refused: {exc}") from None
    except requests.HTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if status >= 500 or status == 429:
            raise TransientError(f"{label}: reference image fetch failed (HTTP {status})") from None
        raise PermanentError(f"{label}: reference image could not be fetched (HTTP {status})") from None
    except requests.RequestException as exc:
        raise TransientError(f"{label}: reference image fetch failed ({type(exc).__name__})") from None
    return data, content_type or "image/png"


def decode_b64(data: str, *, label: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise AmbiguousError(f"{label}: the provider returned output that is not valid base64") from None


# --- Outputs --------------------------------------------------------------------------

CONTENT_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
    "gif": "image/gif",
    "mp4": "video/mp4",
    "webm": "video/webm",
    "mov": "video/quicktime",
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "m4a": "audio/mp4",
    "ogg": "audio/ogg",
    "flac": "audio/flac",
    "txt": "text/plain",
}


def content_type_for(name: str) -> str:
    """`png`, `image.png` or a URL (query ignored) → a content type, or ''."""
    path = urlsplit(name).path if "/" in (name or "") else (name or "")
    ext = path.rsplit(".", 1)[-1].lower() if path else ""
    return CONTENT_TYPES.get(ext, "")


def kind_of(content_type: str, default: str) -> str:
    for kind in ("image", "video", "audio"):
        if content_type.startswith(kind + "/"):
            return kind
    return default


def layered(job: ResolvedJob) -> bool:
    """Is this a layer-decomposition job (one composite, then transparent layers)? The
    draft says so (`params.layered`), the provider lists the model (`options.layered_models`),
    or the catalogue marks it."""
    from queue_app.providers.catalogue import model_spec

    if job.params.get("layered") or job.model in (job.options.get("layered_models") or ()):
        return True
    spec = model_spec(job.family, job.model)
    return bool(spec and spec.extra.get("layers"))


def with_roles(job: ResolvedJob, outputs: list[Output]) -> list[Output]:
    """Mark a layered result: index 0 is the composite (the base), 1… are layers (at most
    MAX_LAYERS; the order is the provider's). Other results are returned unchanged."""
    from dataclasses import replace

    if not layered(job) or len(outputs) < 2:
        return outputs
    outputs = outputs[: 1 + MAX_LAYERS]
    return [replace(outputs[0], role="composite")] + [replace(output, role="layer") for output in outputs[1:]]
