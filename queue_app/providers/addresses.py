"""Where an outbound call may go: the one address policy that `net` (the HTTP client and
its WebSocket sessions) applies before a connection is made and again once it is open.

- `https` only unless OUTBOUND_ALLOW_HTTP is set, or the host's OUTBOUND_ALLOWLIST entry is
  written `http://host[:port]` (an allowlisted `host:port` alone is still https-only);
- no private, loopback, link-local (cloud metadata) or otherwise non-public addresses
  unless the host is on OUTBOUND_ALLOWLIST (or the allowlist of the current purpose);
- IPv6 forms that carry an IPv4 address (mapped, NAT64, 6to4, Teredo, IPv4-compatible)
  are judged by the IPv4 address inside, or refused outright where no public use exists;
- a refusal says "address not allowed" and never what a name resolved to (that would
  map the inside of the network for whoever typed the name).
"""

import contextlib
import contextvars
import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from queue_app.providers.crypto import scrub_urls


class UnsafeURL(ValueError):
    """The URL points somewhere outbound calls may not go."""


class Unresolved(UnsafeURL):
    """The host's name did not resolve. A form refuses such an address like any other;
    a call made through `net` turns it into `net.NotSent` (nothing was sent: transient)."""


# Allowlists kept elsewhere for one purpose only (the ComfyUI app registers the private
# hosts staff allowed for ComfyUI instances): consulted while `purpose(name)` is in effect,
# so a host allowed for ComfyUI is still refused to provider calls, downloads and pushes.
_purpose = contextvars.ContextVar("outbound_purpose", default="")
_purpose_allowlists: dict = {}


def register_allowlist(name: str, entries) -> None:
    """`entries()` returns more OUTBOUND_ALLOWLIST-style entries for calls made under
    `purpose(name)`; read on every check, so a change takes effect at once."""
    _purpose_allowlists[name] = entries


@contextlib.contextmanager
def purpose(name: str):
    token = _purpose.set(name)
    try:
        yield
    finally:
        _purpose.reset(token)


def set_purpose(name: str) -> None:
    """For a coroutine: its task's calls are made for `name` (a task has its own context)."""
    _purpose.set(name)


def _allow_entries() -> list:
    entries = _purpose_allowlists.get(_purpose.get())
    return list(settings.OUTBOUND_ALLOWLIST) + (list(entries()) if entries else [])


def allowlisted(host: str, port: int | None, *, scheme: str = "") -> bool:
    """Whether `host` (or `host:port`) is on OUTBOUND_ALLOWLIST (or the allowlist of the
    current purpose): exempt from the private-address guard. With `scheme="http"`, whether
    plain http to it is allowed too: only an entry written `http://host[:port]` allows
    that (or OUTBOUND_ALLOW_HTTP for all)."""
    names = {host} | ({f"{host}:{port}"} if port is not None else set())
    allow = _allow_entries()
    if scheme == "http":
        return any(f"http://{name}" in allow for name in names)
    return any(name in allow or f"http://{name}" in allow for name in names)


# NAT64 (RFC 6052) carries an IPv4 address in its last 32 bits; the local-use prefix
# (RFC 8215) translates to whatever the operator's network holds: never public.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


def public_address(address: str) -> bool:
    """Whether `address` is a global unicast address. An IPv6 address that embeds an IPv4
    one is judged by that IPv4 address (Python's `is_global` calls ::127.0.0.1 and
    2002:7f00:1:: global): mapped, NAT64 and 6to4 by the address inside; Teredo,
    IPv4-compatible (::a.b.c.d, deprecated) and local-use NAT64 are refused outright."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if ip.version == 6:
        if ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        elif int(ip) >> 32 == 0 or ip.teredo or ip in NAT64_LOCAL:
            return False
        elif ip in NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        elif ip.sixtofour:
            ip = ip.sixtofour
    return ip.is_global and not ip.is_multicast


def _resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to. Tests replace this (there is no DNS in CI)."""
    return [info[4][0] for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)]


def _shown(url: str) -> str:
    """A refused URL as a message may quote it: no credentials, path or query."""
    return scrub_urls(url).rsplit("@", 1)[-1][:80]


def check_url(url: str) -> None:
    """Raise UnsafeURL unless `url` may be fetched. Resolves the host: every address it
    resolves to must be public (a name that also points inside is refused)."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError:  # "http://[::1": an unparseable URL is a refusal, not a crash
        raise UnsafeURL(f"not a valid URL: {_shown(url)!r}") from None
    if not host:
        raise UnsafeURL(f"not an absolute URL: {_shown(url)!r}")
    try:
        port = parts.port
    except ValueError:
        raise UnsafeURL(f"bad port in {_shown(url)!r}") from None
    plain_http_allowed = settings.OUTBOUND_ALLOW_HTTP or allowlisted(host, port, scheme="http")
    if parts.scheme != "https" and not (parts.scheme == "http" and plain_http_allowed):
        raise UnsafeURL(
            f"only https URLs are allowed, not {parts.scheme!r}: plain http to a host needs it on OUTBOUND_ALLOWLIST "
            f"as http://{host}{f':{port}' if port else ''} (read at start: restart the processes after changing it)"
        )
    if allowlisted(host, port):
        return
    try:
        addresses = _resolve(host, port or (443 if parts.scheme == "https" else 80))
    except (socket.gaierror, UnicodeError):
        raise Unresolved(f"cannot resolve {host!r}") from None
    if not addresses:
        raise Unresolved(f"cannot resolve {host!r}")
    if not all(public_address(address) for address in addresses):
        raise UnsafeURL(
            f"address not allowed: {host!r} is not a public address (a private host needs to be on OUTBOUND_ALLOWLIST, "
            "read at start: restart the processes after changing it)"
        )


def plain_address(url: str) -> str:
    """A stored address (a provider's base URL, a ComfyUI instance) is a scheme, host, port
    and path prefix: calls append their own paths to it. A query or a fragment would let a
    user aim a call at an exact path of their choosing, and user:password@ would carry a
    secret where the write-only fields cannot guard it: each is refused, readably."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise ValueError("an address carries no user name or password (user:password@): enter the password in its own field")
    if parts.query or "?" in url:
        raise ValueError("an address ends at its path: no query (?…)")
    if parts.fragment or "#" in url:
        raise ValueError("an address ends at its path: no fragment (#…)")
    return url


def validate_base_url(url: str) -> str:
    """For provider base_url overrides: an address only (`plain_address`) that passes the
    guard, or ValueError with a readable message."""
    plain_address(url)
    try:
        check_url(url)
    except UnsafeURL as exc:
        raise ValueError(str(exc)) from None
    return url.rstrip("/")
