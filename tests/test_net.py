"""The one outbound HTTP client: SSRF guard, redirects, size cap, credentials, base URLs."""

import pytest
import requests
import responses

from queue_app.providers import net
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
        settings.OUTBOUND_ALLOWLIST = [fake.host]
        data, content_type = net.download(f"{fake.url}/files/1/0.png")
    assert data.startswith(b"\x89PNG") and content_type == "image/png"


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
    settings.OUTBOUND_ALLOWLIST = ["127.0.0.1:8999"]
    assert net.validate_base_url("http://127.0.0.1:8999/openapi/v2") == "http://127.0.0.1:8999/openapi/v2"
    with pytest.raises(ValueError):
        net.validate_base_url("http://127.0.0.1:9000/openapi/v2")  # another port is not allowlisted


def test_a_connection_failure_is_a_requests_error_not_a_hang(settings):
    settings.OUTBOUND_ALLOWLIST = ["127.0.0.1:9"]
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
        with pytest.raises(net.UnsafeURL, match="non-public address"):
            net.request("GET", url)
        assert fake.hits["download"] == 0
        settings.OUTBOUND_ALLOWLIST = ["rebind.example"]  # an allowed name may be private
        assert net.request("GET", url).content.startswith(b"\x89PNG")
