"""The one HTTP client every outbound call goes through.

- explicit connect/read timeouts on every call;
- a size cap on every body (streamed, counted, cut off);
- `https` only unless OUTBOUND_ALLOW_HTTP is set;
- no private, loopback, link-local (cloud metadata) or otherwise non-public addresses,
  checked on every hop of a redirect, unless the host is on OUTBOUND_ALLOWLIST;
- never retries on its own (a POST to a paid API must not be sent twice by a library).
"""

import ipaddress
import socket
from urllib.parse import urljoin, urlsplit

import requests
from django.conf import settings

CONNECT_TIMEOUT = 10
READ_TIMEOUT = 120
MAX_REDIRECTS = 5


class UnsafeURL(ValueError):
    """The URL points somewhere outbound calls may not go."""


class TooLarge(ValueError):
    """The body is over the size cap."""


def _allowlisted(host: str, port: int | None) -> bool:
    allow = settings.OUTBOUND_ALLOWLIST
    return host in allow or (port is not None and f"{host}:{port}" in allow)


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_url(url: str) -> None:
    """Raise UnsafeURL unless `url` may be fetched. Resolves the host: every address it
    resolves to must be public (a name that also points inside is refused)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        raise UnsafeURL(f"not an absolute URL: {url[:80]!r}")
    try:
        port = parts.port
    except ValueError:
        raise UnsafeURL(f"bad port in {url[:80]!r}") from None
    if _allowlisted(host, port):
        if parts.scheme not in ("http", "https"):
            raise UnsafeURL(f"scheme {parts.scheme!r} is not allowed")
        return
    if parts.scheme != "https" and not (parts.scheme == "http" and settings.OUTBOUND_ALLOW_HTTP):
        raise UnsafeURL(f"only https URLs are allowed, not {parts.scheme!r}")
    try:
        infos = socket.getaddrinfo(host, port or (443 if parts.scheme == "https" else 80), proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise UnsafeURL(f"cannot resolve {host!r}: {exc}") from None
    for info in infos:
        if not _public(info[4][0]):
            raise UnsafeURL(f"{host!r} resolves to a non-public address ({info[4][0]})")


def validate_base_url(url: str) -> str:
    """For provider base_url overrides: the same guard, a readable message."""
    try:
        check_url(url)
    except UnsafeURL as exc:
        raise ValueError(str(exc)) from None
    return url.rstrip("/")


_session = requests.Session()
_session.trust_env = False


def request(
    method: str,
    url: str,
    *,
    timeout: tuple | float | None = None,
    max_bytes: int | None = None,
    **kwargs,
) -> requests.Response:
    """One HTTP request through the guard, redirects followed by hand (each hop checked),
    body read up to `max_bytes`. The response's `.content` is already loaded."""
    timeout = timeout or (CONNECT_TIMEOUT, READ_TIMEOUT)
    max_bytes = max_bytes or settings.OUTBOUND_MAX_BYTES
    for _ in range(MAX_REDIRECTS + 1):
        check_url(url)
        response = _session.request(method, url, timeout=timeout, allow_redirects=False, stream=True, **kwargs)
        if response.is_redirect and method.upper() in ("GET", "HEAD"):
            url = urljoin(url, response.headers["location"])
            response.close()
            continue
        _read_capped(response, max_bytes)
        return response
    raise UnsafeURL(f"more than {MAX_REDIRECTS} redirects")


def _read_capped(response: requests.Response, max_bytes: int) -> None:
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        response.close()
        raise TooLarge(f"response of {int(declared)} bytes is over the {max_bytes}-byte cap")
    chunks, total = [], 0
    for chunk in response.iter_content(64 * 1024):
        total += len(chunk)
        if total > max_bytes:
            response.close()
            raise TooLarge(f"response is over the {max_bytes}-byte cap")
        chunks.append(chunk)
    response._content = b"".join(chunks)
    response._content_consumed = True


def download(url: str, *, headers: dict | None = None, max_bytes: int | None = None) -> tuple[bytes, str]:
    """GET an output file: (bytes, content type). Raises for non-2xx answers."""
    response = request("GET", url, headers=headers or {}, max_bytes=max_bytes)
    response.raise_for_status()
    return response.content, response.headers.get("content-type", "").split(";")[0].strip()
