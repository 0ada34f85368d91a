"""Secrets: at rest (Fernet with the key from FIELD_ENCRYPTION_KEY, derived only in
development), and out of anything stored, shown or logged (`redact`, `scrub_urls`, the
log formatter)."""

import logging
import re
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


@lru_cache(maxsize=4)
def _fernet(key: str) -> Fernet:
    return Fernet(key.encode() if isinstance(key, str) else key)


def encrypt(plaintext: str) -> str:
    if not plaintext:
        return ""
    return _fernet(settings.FIELD_ENCRYPTION_KEY).encrypt(plaintext.encode()).decode()


def encrypted(field: str) -> property:
    """A model attribute read and written in plain text and stored encrypted in `field`
    (a provider's secret, a ComfyUI password): the plain text is never a column."""
    return property(lambda row: decrypt(getattr(row, field)), lambda row, value: setattr(row, field, encrypt(value)))


# Every secret this process has decrypted: the log formatter redacts them from every
# record, tracebacks included (an exception message can quote a provider's key).
_seen_secrets: set[str] = set()


def decrypt(token: str) -> str:
    if not token:
        return ""
    try:
        secret = _fernet(settings.FIELD_ENCRYPTION_KEY).decrypt(token.encode()).decode()
        if len(secret) >= 6:
            _seen_secrets.add(secret)
        return secret
    except InvalidToken:
        # A rotated key must not crash pages; the provider simply has no usable key.
        return ""


def hint(value: str) -> str:
    """What a page may show of a secret: at most its last four characters."""
    return f"…{value[-4:]}" if value and len(value) >= 8 else ("set" if value else "")


REDACTED = "[redacted]"
# A run of this many characters of a secret is taken for the secret (a key cut short, or
# cut in two by a line break); shorter secrets are only matched whole.
FRAGMENT = 8
# A text cut in the middle of a secret (reasons are truncated): this much of the secret's
# start at the cut is enough to redact.
CUT_FRAGMENT = 4
_CUT_MARKS = "…. \n\"'"


def secret_forms(secret: str, *, username: str = "") -> list[str]:
    """The ways a secret comes back in text: as is, URL-encoded, JSON-escaped, base64 (an
    echoed header), and HTTP Basic's base64 of "user:password" (`username` may be empty).
    A Bearer token is the secret itself."""
    import base64
    import json
    from urllib.parse import quote, quote_plus

    if not secret:
        return []
    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret), json.dumps(secret)[1:-1]}
    for raw in (secret, f"{username}:{secret}"):
        encoded = base64.b64encode(raw.encode()).decode()
        forms |= {encoded, encoded.rstrip("="), base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")}
    # Inside a longer base64 text (Basic with a user name we do not know) the secret's
    # encoding depends on its offset modulo 3: keep the blocks that hold only the secret.
    for offset in (1, 2):
        encoded = base64.b64encode(b"\0" * offset + secret.encode()).decode().rstrip("=")
        inner = encoded[4 : len(encoded) - 4]
        if len(inner) >= FRAGMENT:
            forms |= {inner, inner.replace("+", "-").replace("/", "_")}
    return sorted(forms, key=len, reverse=True)


def redact(text: str, secrets) -> str:
    """`text` with every secret replaced — the one redaction of everything a provider or a
    ComfyUI instance says before it is stored, shown or logged. Providers echo keys in error
    messages ("Incorrect API key provided: sk-…"), upper-cased, URL-encoded or in a header.

    `secrets` are plain secrets (each expanded by `secret_forms`) or lists of forms already
    expanded. Matching ignores case; a run of FRAGMENT characters of a secret counts as the
    secret, and so does its first CUT_FRAGMENT characters where the text ends (a reason
    cut short in the middle of the key). Redact before truncating where you can; this
    catches what was truncated first."""

    if not text:
        return text
    forms = []
    for secret in secrets:
        if isinstance(secret, (list, tuple)):
            forms += [form for form in secret if form]
        elif secret and len(secret) >= 6:
            forms += secret_forms(secret)
    if not forms:
        return text
    # Lower-cased one character at a time, so indexes stay those of `text`.
    lowered = "".join(char.lower() if len(char.lower()) == 1 else char for char in text)
    spans = []
    for form in dict.fromkeys(form.lower() for form in forms if len(form) >= 6):
        spans += _occurrences(lowered, form)
    spans += _cut_at_end(lowered, forms)
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, last = [], 0
    for start, end in merged:
        out += [text[last:start], REDACTED]
        last = end
    out.append(text[last:])
    return "".join(out)


def _occurrences(text: str, form: str) -> list[tuple[int, int]]:
    """Spans of `text` that are `form` or a run of at least FRAGMENT of its characters."""
    spans = []
    size = len(form) if len(form) < FRAGMENT * 2 else FRAGMENT
    seen = set()
    for offset in range(0, len(form) - size + 1):
        gram = form[offset : offset + size]
        if gram in seen:
            continue
        seen.add(gram)
        at = text.find(gram)
        while at != -1:
            # Grow the match both ways while it still follows the secret.
            start, end, left, right = at, at + size, offset, offset + size
            while start > 0 and left > 0 and text[start - 1] == form[left - 1]:
                start, left = start - 1, left - 1
            while end < len(text) and right < len(form) and text[end] == form[right]:
                end, right = end + 1, right + 1
            spans.append((start, end))
            at = text.find(gram, at + 1)
    return spans


def _cut_at_end(text: str, forms: list[str]) -> list[tuple[int, int]]:
    """The start of a secret where a truncated text ends ("… key sk-Ab…")."""
    body = text.rstrip(_CUT_MARKS)
    for form in forms:
        form = form.lower()
        for size in range(min(len(form), len(body)), CUT_FRAGMENT - 1, -1):
            if body.endswith(form[:size]):
                return [(len(body) - size, len(body))]
    return []


# A URL's path and query: a signed output URL is a credential while it lives, and a path
# can carry a key or a prompt. The host is kept (it says which service was meant).
_URL_TAIL = re.compile(r"(\bhttps?://[^/\s'\"?#<>]+)[/?#][^\s'\"<>)]*")
_URLLIB3_URL = re.compile(r"(with url: )[^\s()]+")


# Credentials in a URL's authority ("http://user:password@host").
_URL_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/\s'\"?#<>@]*@", re.IGNORECASE)


def scrub_urls(text: str) -> str:
    """`text` with every URL cut to its scheme and host (credentials in it dropped)."""
    text = _URL_USERINFO.sub(r"\1", text)
    return _URLLIB3_URL.sub(r"\1[…]", _URL_TAIL.sub(r"\1/[…]", text))


def origin(url: str) -> str:
    """What a message may show of an address: scheme://host[:port] — no credentials, path
    or query (a token can sit in any of them)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit((url or "").strip())
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "[address]"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}" if parts.scheme and host else "[address]"


class RedactingFormatter(logging.Formatter):
    """The log format of every process: tracebacks and messages are scrubbed of URL paths
    and queries (an exception from a download names the signed URL it failed on) and of
    every secret this process has decrypted (an exception can quote a provider's key)."""

    def format(self, record: logging.LogRecord) -> str:
        text = scrub_urls(super().format(record))
        secrets = list(_seen_secrets)
        return redact(text, secrets) if secrets else text
