"""The one outbound HTTP client: SSRF guard, redirects, size cap, credentials, base URLs."""

import pytest
import requests
import responses

from queue_app.providers import addresses, net
from tests.engine_helpers import stop_listeners
from tests.fakes.async_provider import FakeAsyncProvider, png
from tests.fakes.dns import use_fake_dns


@pytest.fixture(autouse=True)
def _dns(monkeypatch, settings):
    use_fake_dns(monkeypatch)
    settings.OUTBOUND_ALLOWLIST = []
    settings.OUTBOUND_ALLOW_HTTP = False


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/x",
        "https://[::1]/x",
        "https://169.254.169.254/latest/meta-data/",
        "https://10.1.2.3/x",
        "https://192.168.0.1/x",
        "https://[::ffff:127.0.0.1]/x",
        "https://metadata.example/computeMetadata/v1/",
        "https://internal.example/x",
        "https://localhost:8000/x",
    ],
)
def test_the_default_guard_refuses_loopback_private_and_metadata_addresses(url):
    with pytest.raises(net.UnsafeURL):
        net.check_url(url)


def test_it_refuses_plain_http_and_other_schemes_by_default():
    for url in ("http://cdn.example.com/a.png", "ftp://cdn.example.com/a.png", "file:///etc/passwd"):
        with pytest.raises(net.UnsafeURL):
            net.check_url(url)
    net.check_url("https://cdn.example.com/a.png")  # a public https URL passes


def test_the_default_guard_refuses_a_real_loopback_server():
    with FakeAsyncProvider() as fake:
        with pytest.raises(net.UnsafeURL):
            net.download(f"{fake.url}/files/1/0.png")
        assert fake.hits["download"] == 0


def test_the_allowlist_lets_tests_reach_their_loopback_fake(settings):
    with FakeAsyncProvider() as fake:
        settings.OUTBOUND_ALLOWLIST = [f"http://{fake.host}"]
        data, content_type = net.download(f"{fake.url}/files/1/0.png")
    assert data.startswith(b"\x89PNG") and content_type == "image/png"


def test_an_allowlisted_host_port_is_not_reached_over_plain_http_unless_its_entry_says_so(settings):
    with FakeAsyncProvider() as fake:
        settings.OUTBOUND_ALLOWLIST = [fake.host]  # exempt from the private-address guard only
        with pytest.raises(net.UnsafeURL, match="only https"):
            net.download(f"{fake.url}/files/1/0.png")
        assert fake.hits["download"] == 0
        settings.OUTBOUND_ALLOW_HTTP = True  # plain http everywhere: the operator's choice
        assert net.download(f"{fake.url}/files/1/0.png")[0].startswith(b"\x89PNG")
        settings.OUTBOUND_ALLOW_HTTP = False
        settings.OUTBOUND_ALLOWLIST = [f"http://{fake.host}"]  # plain http to this one only
        assert net.download(f"{fake.url}/files/1/0.png")[0].startswith(b"\x89PNG")
        with pytest.raises(net.UnsafeURL, match="only https"):
            net.check_url("http://example.com/x")


@responses.activate
@pytest.mark.parametrize(
    "target", ["http://169.254.169.254/latest/meta-data/iam", "https://internal.example/secret", "https://127.0.0.1:9000/"]
)
def test_a_redirect_to_a_private_address_is_refused(target):
    responses.add(responses.GET, "https://cdn.example.com/out.png", status=302, headers={"Location": target})
    with pytest.raises(net.UnsafeURL):
        net.download("https://cdn.example.com/out.png")
    # only the first hop was requested: the private target never was
    assert [call.request.url for call in responses.calls] == ["https://cdn.example.com/out.png"]


@responses.activate
def test_a_redirect_to_a_public_address_is_followed_without_the_credentials():
    responses.add(
        responses.GET, "https://api.example.com/v1/file", status=302, headers={"Location": "https://blobs.example.net/f.png"}
    )
    responses.add(responses.GET, "https://blobs.example.net/f.png", body=png(), content_type="image/png")
    data, _ = net.download("https://api.example.com/v1/file", headers={"Authorization": "Bearer sk-1", "x-goog-api-key": "k"})
    assert data.startswith(b"\x89PNG")
    first, second = responses.calls
    assert first.request.headers["Authorization"] == "Bearer sk-1"
    assert "Authorization" not in second.request.headers and "x-goog-api-key" not in second.request.headers


# --- one redirect rule: credentials go no further than their origin ---------------------------

SECRETS = {"Authorization": "Bearer sk-1", "x-goog-api-key": "k", "Cookie": "session=s"}


def fetch_both_ways(url, tmp_path):
    """The two ways a file is fetched — `download` and `stream_to_file` — both through the
    one redirect loop; what each hop was sent, per way."""
    sent = {}
    for way in ("download", "stream"):
        before = len(responses.calls)
        if way == "download":
            net.download(url, headers=dict(SECRETS))
        else:
            net.stream_to_file(url, tmp_path / "out.png", headers=dict(SECRETS))
        sent[way] = [call.request.headers for call in responses.calls[before:]]
    return sent


def carries_secrets(headers) -> bool:
    return any(name in headers for name in SECRETS)


@responses.activate
@pytest.mark.parametrize(
    "hops",
    [
        ["https://api.example.com/v1/file", "http://api.example.com/v1/file"],  # same host, down to http
        ["https://api.example.com/v1/file", "https://cdn.example.net/f.png"],  # another host
        ["https://api.example.com/v1/file", "https://api.example.com:8443/f.png"],  # another port
        ["https://api.example.com/v1/file", "https://cdn.example.net/f.png", "https://api.example.com/f.png"],  # and back
    ],
    ids=["https-to-http", "cross-host", "other-port", "away-and-back"],
)
def test_a_redirect_that_leaves_the_origin_drops_the_credentials_for_good(settings, tmp_path, hops):
    settings.OUTBOUND_ALLOW_HTTP = True
    for here, there in zip(hops, hops[1:], strict=False):
        responses.add(responses.GET, here, status=302, headers={"Location": there})
    responses.add(responses.GET, hops[-1], body=png(), content_type="image/png")
    for way, sent in fetch_both_ways(hops[0], tmp_path).items():
        assert carries_secrets(sent[0]), way
        assert not any(carries_secrets(headers) for headers in sent[1:]), (way, [dict(h) for h in sent])


@responses.activate
def test_a_cookie_one_answer_sets_rides_on_no_later_request(tmp_path):
    # the session serves every user's calls: user A's cookie must not reach a host with B's
    responses.add(responses.GET, "https://api.example.com/a", body="ok", headers={"Set-Cookie": "session=user-a; Path=/"})
    responses.add(responses.GET, "https://api.example.com/b", body="ok")
    net.request("GET", "https://api.example.com/a")
    net.request("GET", "https://api.example.com/b")
    assert "Cookie" not in responses.calls[1].request.headers


@responses.activate
def test_a_redirect_within_the_origin_keeps_the_credentials(tmp_path):
    responses.add(responses.GET, "https://api.example.com/v1/file", status=302, headers={"Location": "/v1/file/content"})
    responses.add(responses.GET, "https://api.example.com/v1/file/content", body=png(), content_type="image/png")
    for way, sent in fetch_both_ways("https://api.example.com/v1/file", tmp_path).items():
        assert all(carries_secrets(headers) for headers in sent), way


@responses.activate
def test_a_body_over_the_cap_is_cut_off(settings):
    settings.OUTBOUND_MAX_BYTES = 1000
    responses.add(responses.GET, "https://cdn.example.com/declared.png", body=b"x" * 5000)
    with pytest.raises(net.TooLarge):
        net.download("https://cdn.example.com/declared.png")

    def undeclared(request):
        return (200, {}, b"y" * 5000)

    responses.add_callback(responses.GET, "https://cdn.example.com/streamed.png", callback=undeclared)
    with pytest.raises(net.TooLarge):
        net.download("https://cdn.example.com/streamed.png", max_bytes=2000)
    data, _ = net.download("https://cdn.example.com/streamed.png", max_bytes=6000)
    assert len(data) == 5000


@responses.activate
def test_a_post_is_never_retried_or_redirected():
    responses.add(responses.POST, "https://api.example.com/create", status=503)
    response = net.request("POST", "https://api.example.com/create", json={})
    assert response.status_code == 503 and len(responses.calls) == 1
    responses.add(responses.POST, "https://api.example.com/moved", status=307, headers={"Location": "https://10.0.0.1/"})
    response = net.request("POST", "https://api.example.com/moved", json={})
    assert response.status_code == 307 and len(responses.calls) == 2


def test_base_url_overrides_go_through_the_same_guard(settings):
    assert net.validate_base_url("https://api.openai.com/v1/") == "https://api.openai.com/v1"
    for url in ("https://169.254.169.254/v1", "http://api.openai.com/v1", "https://internal.example/v1"):
        with pytest.raises(ValueError):
            net.validate_base_url(url)
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1:8999"]
    assert net.validate_base_url("http://127.0.0.1:8999/openapi/v2") == "http://127.0.0.1:8999/openapi/v2"
    with pytest.raises(ValueError):
        net.validate_base_url("http://127.0.0.1:9000/openapi/v2")  # another port is not allowlisted


def test_a_connection_failure_is_a_requests_error_not_a_hang(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1:9"]
    with pytest.raises(requests.ConnectionError):
        net.request("GET", "http://127.0.0.1:9/", timeout=(2, 2))


def test_a_name_that_rebinds_to_loopback_after_the_check_is_refused_at_the_connection(monkeypatch, settings):
    """DNS rebinding: the check resolves the name to a public address, the connection's
    own lookup gets loopback. The socket's real peer is checked before a byte is sent."""
    import socket

    settings.OUTBOUND_ALLOW_HTTP = True
    real_getaddrinfo = socket.getaddrinfo

    def rebinding(host, *args, **kwargs):
        return real_getaddrinfo("127.0.0.1" if host == "rebind.example" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    with FakeAsyncProvider() as fake:
        url = f"http://rebind.example:{fake.port}/files/1/0.png"
        net.check_url(url)  # the check alone is fooled: the fake resolver says public
        with pytest.raises(net.UnsafeURL, match="address not allowed"):
            net.request("GET", url)
        assert fake.hits["download"] == 0
        settings.OUTBOUND_ALLOWLIST = ["rebind.example"]  # an allowed name may be private
        assert net.request("GET", url).content.startswith(b"\x89PNG")


# --- IPv4 inside IPv6, and what a refusal says ----------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:10.0.0.1",  # IPv4-mapped
        "::ffff:169.254.169.254",
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of the metadata address
        "64:ff9b:1::808:808",  # local-use NAT64: the operator's own network
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a00:1::",  # 6to4 of 10.0.0.1
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "::127.0.0.1",  # IPv4-compatible (deprecated)
        "::8.8.8.8",
        "fe80::1%eth0",  # link-local with a zone
        "ff02::1",  # multicast
        "::",
    ],
)
def test_ipv6_forms_that_carry_a_private_ipv4_address_are_refused(address):
    assert not addresses.public_address(address)
    with pytest.raises(net.UnsafeURL, match="address not allowed"):
        net.check_url(f"https://[{address.split('%')[0]}]/x")


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8", "2606:4700::1111"])
def test_ipv6_forms_of_a_public_address_stay_allowed(address):
    assert addresses.public_address(address)


def test_a_refusal_does_not_say_what_a_name_resolved_to(monkeypatch):
    monkeypatch.setattr("queue_app.providers.addresses._resolve", lambda host, port: ["93.184.216.34", "10.20.30.40"])
    with pytest.raises(net.UnsafeURL) as refused:
        net.check_url("https://mixed.example/x")
    assert "address not allowed" in str(refused.value) and "10.20.30.40" not in str(refused.value)


# --- WebSockets: the ComfyUI listener -------------------------------------------------------


class _Counting:
    """A TCP listener that counts the connections it accepts (and answers nothing useful)."""

    def __init__(self):
        import socket
        import threading

        self.accepted = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self):
        self.sock.close()


def _listen_briefly(base_url: str, seconds: float = 2.0) -> None:
    import time

    from comfy_app import client as comfy
    from comfy_app.ws import Listeners

    listeners = Listeners(on_event=lambda instance_id: None)
    try:
        listeners.ensure(1, base_url, "client-1", comfy.ComfyClient(base_url))
        time.sleep(seconds)
    finally:
        stop_listeners(listeners)


def test_the_comfyui_socket_does_not_follow_a_redirect_to_an_unchecked_address(settings):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    inside = _Counting()

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{inside.port}/ws?clientId=client-1")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        settings.OUTBOUND_ALLOWLIST = [f"127.0.0.1:{server.server_address[1]}"]  # the instance only
        settings.OUTBOUND_ALLOW_HTTP = True
        _listen_briefly(f"http://127.0.0.1:{server.server_address[1]}")
        assert inside.accepted == 0
    finally:
        server.shutdown()
        server.server_close()
        inside.close()


def test_the_comfyui_socket_checks_the_address_it_connects_to(monkeypatch, settings):
    """The check resolves `localhost` to a public address (the fake resolver); the
    connection itself reaches loopback: refused before the upgrade is sent."""
    inside = _Counting()
    monkeypatch.setattr("queue_app.providers.addresses._resolve", lambda host, port: ["93.184.216.34"])
    try:
        settings.OUTBOUND_ALLOW_HTTP = True
        _listen_briefly(f"http://localhost:{inside.port}")
        assert inside.accepted == 0
        settings.OUTBOUND_ALLOWLIST = [f"localhost:{inside.port}"]  # an allowed host may be private
        _listen_briefly(f"http://localhost:{inside.port}", seconds=1.0)
        assert inside.accepted >= 1
    finally:
        inside.close()


def test_a_call_stuck_on_a_provider_that_keeps_working_returns_once_aborted_from_another_thread(settings):
    # A worker whose lease may have run out (its host cut off from the database) must
    # leave the provider call another host may be repeating (chaos-hosts scenario 3).
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    host, port = server.getsockname()
    settings.OUTBOUND_ALLOWLIST = [f"http://{host}:{port}"]
    received = threading.Event()

    def silent_provider():
        conn, _ = server.accept()
        conn.recv(65536)
        received.set()
        conn.recv(1)  # works on, answers never; returns when the client goes

    threading.Thread(target=silent_provider, daemon=True).start()
    outcome = []

    def worker(handle_box):
        with net.abortable() as abort:
            handle_box.append(abort)
            try:
                net.request("POST", f"http://{host}:{port}/v1/images", json={}, timeout=(5, 60))
            except requests.RequestException as error:
                outcome.append(error)

    box = []
    thread = threading.Thread(target=worker, args=(box,), daemon=True)
    thread.start()
    assert received.wait(10)
    box[0]()  # from this thread, as the lease watch does
    thread.join(timeout=10)
    server.close()
    assert not thread.is_alive() and len(outcome) == 1
