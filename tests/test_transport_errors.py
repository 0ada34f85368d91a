"""The outbound guard's errors keep their class, tested through the real guard against
real sockets: a refused connection, a name that does not resolve and a TLS server with a
certificate nobody signed were never sent — transient "not sent", on a create call too,
so the hold policy never parks a job because its provider is simply down — while a
request that was written and then lost stays ambiguous on a create call."""

import datetime
import socket
import ssl
import threading

import pytest
import requests

from queue_app.models import ErrorClass, Job, Status
from queue_app.providers import http_errors, net
from queue_app.providers.base import AmbiguousError, TransientError
from queue_app.services.jobs import jobs_start
from tests.factories import make_drafts, make_project, make_provider


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens


@pytest.fixture
def refused(settings):
    port = closed_port()
    settings.OUTBOUND_ALLOWLIST = [f"http://127.0.0.1:{port}"]
    return f"http://127.0.0.1:{port}/v1/images"


def self_signed(tmp_path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


class Listener:
    """A TCP server on loopback: TLS with `cert` (the handshake is all it does), or one
    that reads a request and hangs up without answering. Counts what it read."""

    def __init__(self, *, cert=None, hang_up=False):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self.context = None
        if cert:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(*cert)
        self.hang_up = hang_up
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                if self.context is not None:
                    conn = self.context.wrap_socket(conn, server_side=True)
                if conn.recv(65536):
                    self.requests += 1
            except (ssl.SSLError, OSError):
                pass
            finally:
                conn.close()

    def close(self):
        self.sock.close()


def test_a_refused_connection_is_not_sent(refused):
    with pytest.raises(net.NotSent) as error:
        net.request("POST", refused, json={})
    assert error.value.cause == "connection refused" and isinstance(error.value, requests.ConnectionError)
    with pytest.raises(TransientError, match="connection refused"):
        http_errors.send("POST", refused, create=True, label="create")


def test_a_name_that_does_not_resolve_is_not_sent(settings):
    url = "https://no-such-provider.invalid/v1/images"
    with pytest.raises(net.NotSent) as error:
        net.request("POST", url, json={})
    assert error.value.cause == "name not resolved"
    with pytest.raises(TransientError, match="name not resolved"):
        http_errors.send("POST", url, create=True, label="create")
    with pytest.raises(ValueError, match="cannot resolve"):
        net.validate_base_url(url)  # a form still refuses such an address


def test_a_tls_server_with_a_bad_certificate_is_not_sent(settings, tmp_path):
    server = Listener(cert=self_signed(tmp_path))
    try:
        settings.OUTBOUND_ALLOWLIST = [f"127.0.0.1:{server.port}"]  # https only
        url = f"https://127.0.0.1:{server.port}/v1/images"
        with pytest.raises(net.NotSent) as error:
            net.request("POST", url, json={"prompt": "x"})
        assert error.value.cause == "TLS handshake failed" and isinstance(error.value, requests.exceptions.SSLError)
        with pytest.raises(TransientError, match="TLS handshake failed"):
            http_errors.send("POST", url, create=True, label="create")
        assert server.requests == 0  # no request was ever written
    finally:
        server.close()


def test_a_request_written_and_then_lost_stays_ambiguous_on_a_create_call(settings):
    server = Listener(hang_up=True)
    try:
        settings.OUTBOUND_ALLOWLIST = [f"http://127.0.0.1:{server.port}"]
        url = f"http://127.0.0.1:{server.port}/v1/images"
        with pytest.raises(requests.ConnectionError) as error:
            net.request("POST", url, json={"prompt": "x"})
        assert not isinstance(error.value, net.NotSent)
        with pytest.raises(AmbiguousError, match="may have been accepted"):
            http_errors.send("POST", url, create=True, label="create")
        with pytest.raises(TransientError):
            http_errors.send("GET", url, create=False, label="check")
        assert server.requests >= 3
    finally:
        server.close()


@pytest.mark.django_db(transaction=True)  # dispatch runs on commit
def test_a_provider_that_is_down_never_parks_jobs_under_the_hold_policy(owner, refused, inline_tasks):
    provider = make_provider(owner, name="Down", family="openai", on_ambiguous="hold")
    provider.api_key = "sk-test-" + "0" * 24
    provider.base_url = refused.rsplit("/images", 1)[0]
    provider.save()
    project = make_project(owner, provider, model="gpt-image-1", kind="image")
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job = Job.objects.get(id=job.id)
    assert job.error_class != ErrorClass.ATTENTION, job.error
    assert (job.status, job.error_class) == (Status.PENDING, "transient") and "connection refused" in job.error
