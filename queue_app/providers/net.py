"""The one HTTP client every outbound call goes through, so the rules hold in one place.

Every URL and every redirect hop passes `addresses.check_url` (the policy lives there), and
the address a socket actually reached is checked again before a byte is sent (DNS
rebinding). Every call has connect/read timeouts and a size cap on its body, never retries
on its own (a paid POST must not be sent twice). Redirects are followed in one loop
(`_send`) under one rule: credentials go no further than the origin (scheme, host, port)
that asked for them, so a hop to another host or down to http drops them for good. A
failure before the request was written (refused, a name that does not resolve, TLS,
connect timeout) is raised as `NotSent`, keeping its class through the message scrubbing.
`abortable` lets another thread stop a call; `ws_session` guards the runner's WebSockets.
"""

import contextlib
import contextvars
import http.cookiejar
import socket
import threading
import time
from urllib.parse import urljoin, urlsplit

import requests
import urllib3
from django.conf import settings

from queue_app.providers import addresses
from queue_app.providers.addresses import (  # noqa: F401  (re-exported: see the docstring)
    Unresolved,
    UnsafeURL,
    check_url,
    purpose,
    register_allowlist,
    set_purpose,
    validate_base_url,
)
from queue_app.providers.transport_errors import NotSent, not_sent, scrubbed  # noqa: F401  (NotSent: callers' too)

CONNECT_TIMEOUT = 10
READ_TIMEOUT = 120
MAX_REDIRECTS = 5


class TooLarge(ValueError):
    """The body is over the size cap."""


def _check_peer(host: str, port: int | None, sock) -> None:
    """The address a new connection reached must be public as well (or its host allowed)."""
    if addresses.allowlisted((host or "").lower(), port):
        return
    address = sock.getpeername()[0]
    if not addresses.public_address(address):
        sock.close()
        raise UnsafeURL(f"address not allowed: {host!r} connected to an address that is not public")


# --- Abortable calls -------------------------------------------------------------------

_abort = contextvars.ContextVar("outbound_abort", default=None)


class Abort:
    """Stops, from another thread, the calls this thread makes under `abortable()`: their
    sockets are shut down, so a read blocked on a provider that is still working returns
    at once (close() alone does not wake it). A worker whose lease may have run out uses
    it: another host may already be running the same job."""

    def __init__(self):
        self._sockets: set = set()
        self._lock = threading.Lock()
        self.fired = threading.Event()

    def track(self, sock) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.add(sock)
        if self.fired.is_set():
            _shut(sock)

    def __call__(self) -> None:
        self.fired.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


@contextlib.contextmanager
def abortable():
    """Calls made in this block can be stopped by calling the yielded `Abort`."""
    handle = Abort()
    token = _abort.set(handle)
    try:
        yield handle
    finally:
        _abort.reset(token)


def _track_socket(conn) -> None:
    handle = _abort.get()
    if handle is not None:
        handle.track(conn.sock)


class _GuardedHTTPConnection(urllib3.connection.HTTPConnection):
    def _new_conn(self):
        sock = super()._new_conn()
        _check_peer(self.host, self.port, sock)
        return sock

    def getresponse(self, *args, **kwargs):
        _track_socket(self)
        return super().getresponse(*args, **kwargs)


class _GuardedHTTPSConnection(urllib3.connection.HTTPSConnection):
    def _new_conn(self):  # before the TLS handshake
        sock = super()._new_conn()
        _check_peer(self.host, self.port, sock)
        return sock

    def getresponse(self, *args, **kwargs):
        _track_socket(self)
        return super().getresponse(*args, **kwargs)


class _GuardedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class _GuardedAdapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _GuardedHTTPPool, "https": _GuardedHTTPSPool}


_session = requests.Session()
_session.trust_env = False
# The session serves every user's calls: a cookie one answer sets must not ride along on the
# next user's request to that host (or on a redirect hop). Callers that need a cookie send
# it themselves (the ComfyUI client's login), so the shared jar keeps none.
_session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
# The poller checks many tasks of one provider at once from its thread pool: keep enough
# pooled connections per host that they are reused, not discarded. No automatic retries.
_session.mount("https://", _GuardedAdapter(pool_maxsize=64, max_retries=0))
_session.mount("http://", _GuardedAdapter(pool_maxsize=64, max_retries=0))

# Dropped from a request that a redirect sends to another origin (requests does the same
# for Authorization when it follows redirects itself; we follow them by hand).
CREDENTIAL_HEADERS = {"authorization", "proxy-authorization", "cookie", "x-goog-api-key", "x-api-key", "api-key"}


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def _without_credentials(headers) -> dict:
    return {key: value for key, value in (headers or {}).items() if key.lower() not in CREDENTIAL_HEADERS}


def request(
    method: str,
    url: str,
    *,
    timeout: tuple | float | None = None,
    max_bytes: int | None = None,
    **kwargs,
) -> requests.Response:
    """One HTTP request through the guard (redirects: `_send`), body read up to
    `max_bytes`. The response's `.content` is already loaded."""
    timeout = timeout or (CONNECT_TIMEOUT, READ_TIMEOUT)
    max_bytes = max_bytes or settings.OUTBOUND_MAX_BYTES
    headers = kwargs.pop("headers", None) or {}
    response = _send(method, url, headers=headers, timeout=timeout, **kwargs)
    _read_capped(response, max_bytes)
    return response


def _send(method: str, url: str, *, headers: dict, timeout, **kwargs) -> requests.Response:
    """The streamed response of `method url`: every hop checked, a GET or HEAD redirect
    followed (never a POST: it must not be sent twice), credentials dropped for good once
    a hop leaves the origin that asked for them — another host or port, or https down to
    http on the same host."""
    for _ in range(MAX_REDIRECTS + 1):
        try:
            check_url(url)
            response = _session.request(
                method, url, headers=headers, timeout=timeout, allow_redirects=False, stream=True, **kwargs
            )
        except Unresolved as error:
            raise not_sent(NotSent, str(error), "name not resolved") from None
        except requests.RequestException as error:
            raise scrubbed(error) from None
        if not (response.is_redirect and method.upper() in ("GET", "HEAD")):
            return response
        next_url = urljoin(url, response.headers["location"])
        response.close()
        if _origin(next_url) != _origin(url):
            headers = _without_credentials(headers)
        url = next_url
    raise UnsafeURL(f"more than {MAX_REDIRECTS} redirects")


def _raise_for_status(response: requests.Response) -> None:
    try:
        response.raise_for_status()
    except requests.HTTPError as error:
        raise scrubbed(error)


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
    _raise_for_status(response)
    return response.content, response.headers.get("content-type", "").split(";")[0].strip()


class Stalled(IOError):
    """A streamed download received no data for too long, or ran past its overall limit."""


def stream_to_file(
    url: str,
    path,
    *,
    headers: dict | None = None,
    idle_timeout: float = 60,
    total_timeout: float = 1800,
    max_bytes: int | None = None,
    clock=None,
) -> tuple[int, str]:
    """GET `url` into the file at `path`, through the same guard as `request`.

    Abandoned only when no data arrives for `idle_timeout` seconds (the socket read
    timeout) or when the whole transfer passes `total_timeout` (checked per chunk with
    `clock`, and by a watchdog that closes the connection, since a trickle of bytes
    would otherwise keep a blocking read alive). Returns (bytes written, content type).
    """
    clock = clock or time.monotonic
    max_bytes = max_bytes or settings.OUTBOUND_MAX_BYTES
    started = clock()
    response = _open_stream(url, headers or {}, idle_timeout)
    expired = threading.Event()
    timer = threading.Timer(max(0.0, total_timeout - (clock() - started)), _watchdog, (response, expired))
    timer.daemon = True
    timer.start()
    try:
        _raise_for_status(response)
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise TooLarge(f"response of {int(declared)} bytes is over the {max_bytes}-byte cap")
        deadline = _Deadline(clock, started, total_timeout, expired)
        total = _write_stream(response, path, max_bytes=max_bytes, idle_timeout=idle_timeout, deadline=deadline)
        deadline.check()
        if declared and declared.isdigit() and int(declared) != total:
            raise Stalled(f"the connection closed after {total} of {declared} bytes")
    finally:
        timer.cancel()
        response.close()
    return total, response.headers.get("content-type", "").split(";")[0].strip()


def _open_stream(url: str, headers: dict, idle_timeout: float) -> requests.Response:
    """The streamed GET's response, through the one redirect loop (`_send`)."""
    try:
        return _send("GET", url, headers=headers, timeout=(CONNECT_TIMEOUT, idle_timeout))
    except requests.Timeout:
        raise Stalled(f"no answer within {idle_timeout:g} s") from None


def _watchdog(response: requests.Response, expired: threading.Event) -> None:
    """Ends a download that ran past its overall limit, from the timer's thread."""
    expired.set()
    try:  # close() alone does not wake a read blocked in another thread; shutdown does
        response.raw._fp.fp.raw._sock.shutdown(socket.SHUT_RDWR)  # http.client's socket
    except Exception:
        pass
    response.close()


class _Deadline:
    """The overall limit of one download: passed by the clock, or fired by the watchdog."""

    def __init__(self, clock, started: float, total_timeout: float, expired: threading.Event):
        self.clock, self.started, self.total_timeout, self.expired = clock, started, total_timeout, expired

    def passed(self) -> Stalled:
        return Stalled(f"the download took longer than {self.total_timeout / 60:g} minutes")

    def check(self) -> None:
        """After the last chunk: the watchdog may have cut the body short."""
        if self.expired.is_set():
            raise self.passed()


def _write_stream(response, path, *, max_bytes: int, idle_timeout: float, deadline: _Deadline) -> int:
    """Writes the body to `path` chunk by chunk under the size cap and the deadline; the
    bytes written. A read the watchdog or the idle timeout broke becomes `Stalled`."""
    total = 0
    with open(path, "wb") as handle:
        try:
            for chunk in response.iter_content(64 * 1024):
                total += len(chunk)
                if total > max_bytes:
                    raise TooLarge(f"response is over the {max_bytes}-byte cap")
                handle.write(chunk)
                if deadline.clock() - deadline.started > deadline.total_timeout:
                    raise deadline.passed()
        except (Stalled, TooLarge):
            raise
        except Exception as error:  # the watchdog's close surfaces as whatever the read hit
            if deadline.expired.is_set():
                raise deadline.passed() from None
            if isinstance(error, requests.Timeout) or "timed out" in str(error).lower():
                raise Stalled(f"no data arrived for {idle_timeout:g} s") from None
            raise
    return total


# --- WebSockets (aiohttp) -------------------------------------------------------------------

# Whether the host of the connection being opened is on OUTBOUND_ALLOWLIST: set by the
# request's start (per task), read by the socket factory, which sees only an address.
_ws_host_allowed = contextvars.ContextVar("ws_host_allowed", default=False)


async def _ws_request_start(session, context, params) -> None:
    url = params.url
    http_url = str(url.with_scheme({"ws": "http", "wss": "https"}.get(url.scheme, url.scheme)))
    check_url(http_url)
    _ws_host_allowed.set(addresses.allowlisted((url.host or "").lower(), url.port))


async def _ws_redirect(session, context, params) -> None:
    # ComfyUI never redirects its socket but to a login page; anywhere else is not ours to go.
    raise UnsafeURL("address not allowed: the WebSocket answered with a redirect, which is not followed")


def _ws_socket(addr_info):
    """aiohttp's socket factory: the address about to be connected to must be public,
    unless the request's host is allowlisted (checked before the connect, so nothing is
    sent to an address the name rebound to)."""
    family, type_, proto, _, address = addr_info
    if not _ws_host_allowed.get() and not addresses.public_address(address[0]):
        raise UnsafeURL("address not allowed: the WebSocket host is not a public address")
    return socket.socket(family=family, type=type_, proto=proto)


def ws_session(**kwargs):
    """An aiohttp ClientSession under this module's rules, for `ws_connect`: the URL checked
    like any other, redirects refused, and each socket's address checked before it
    connects. No proxies or .netrc from the environment."""
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(_ws_request_start)
    trace.on_request_redirect.append(_ws_redirect)
    connector = aiohttp.TCPConnector(socket_factory=_ws_socket)
    return aiohttp.ClientSession(connector=connector, trace_configs=[trace], trust_env=False, **kwargs)
