"""Secrets are redacted wherever they could come back (issue 18 §4).

- one redaction (providers/crypto.redact): case-insensitive, partial occurrences (a key cut
  by a truncation, half a key), and the forms a secret is echoed in (Bearer, Basic base64
  of user:password, URL-encoded, JSON-escaped);
- a provider that echoes its key upper-cased, near the 300-character cut of its reason,
  or in a header it quotes back: no part of the key is stored or logged;
- a ComfyUI instance that echoes its password (or its Basic credentials) in an execution
  error or a validation error: none of it reaches the job's reason;
- a failed download of a signed output URL: the signature reaches neither the job's
  reason nor the log (the log formatter cuts every URL to its host).
"""

import base64
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest

from comfy_app import client as comfy
from queue_app.models import Status
from queue_app.providers import crypto, net
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider

KEY = "sk-proj-Zq8XbN4vT1mKc7LpR2wYh5GdJ3sFa9Ue6Oi0"
PASSWORD = "correct-Horse-battery-9"


def fragments(secret: str, size: int = 8) -> set[str]:
    return {secret[i : i + size].lower() for i in range(len(secret) - size + 1)}


def leaks(text: str, secret: str) -> list[str]:
    lowered = text.lower()
    return sorted(part for part in fragments(secret) if part in lowered)


# --- the function ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        f"Incorrect API key provided: {KEY}.",
        f"INCORRECT API KEY PROVIDED: {KEY.upper()}.",
        f"Authorization: Bearer {KEY}",
        f"api_key={quote(KEY, safe='')}&x=1",
        f"echo: {base64.b64encode(KEY.encode()).decode()}",
        f"header was Basic {base64.b64encode(f'user:{KEY}'.encode()).decode()}",
        f'{{"key": {json.dumps(KEY)}}}',
        f"half a key: {KEY[5:25]} and the rest",
        f"{KEY[:20]}\n{KEY[20:]}",  # split by a line break
        ("x" * 283 + " key: " + KEY)[:299] + "…",  # cut in the middle, 10 characters in
        ("x" * 288 + " key: " + KEY)[:299] + "…",  # cut 5 characters in
    ],
    ids=["plain", "upper", "bearer", "urlencoded", "base64", "basic", "json", "half", "split", "cut-10", "cut-5"],
)
def test_every_form_of_a_secret_is_redacted(text):
    redacted = crypto.redact(text, [KEY])
    assert "[redacted]" in redacted
    assert leaks(redacted, KEY) == [] and KEY[:5].lower() not in redacted.lower()[-10:]


def test_basic_credentials_of_a_user_and_password_are_redacted():
    header = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    assert header not in crypto.redact(f"sent Basic {header}", [crypto.secret_forms(PASSWORD, username="admin")])


def test_text_without_a_secret_is_left_alone():
    text = "The model is overloaded (HTTP 503). Try again in 30 s — İstanbul region."
    assert crypto.redact(text, [KEY, PASSWORD]) == text
    assert crypto.redact(text, ["", None, "short"]) == text


def test_redacting_before_or_after_a_cut_leaves_no_part_of_the_key():
    reason = "Incorrect API key provided: " + KEY.upper() + " — see the docs"
    for cut in range(28, len(reason)):
        assert leaks(crypto.redact(reason[:cut], [KEY]), KEY) == [], cut


# --- a provider that echoes its key ----------------------------------------------------------


def _echo_server(message):
    class Echo(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("Authorization", "").removeprefix("Bearer ")
            body = json.dumps({"error": {"message": message(key), "type": "invalid_request_error"}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "message",
    [
        lambda key: "Invalid value. Your key " + key.upper() + " is not allowed for this model.",
        lambda key: "x" * 283 + " key: " + key,  # the key straddles the 300-character cut
        lambda key: "request headers: Authorization=Bearer%20" + quote(key, safe=""),
    ],
    ids=["upper-cased", "at-the-cut", "url-encoded"],
)
def test_a_provider_that_echoes_its_key_leaves_no_part_of_it_stored_or_logged(owner, inline_tasks, settings, caplog, message):
    server = _echo_server(message)
    try:
        settings.OUTBOUND_ALLOWLIST = [f"127.0.0.1:{server.server_address[1]}"]
        settings.OUTBOUND_ALLOW_HTTP = True
        provider = make_provider(owner, name="Echo", family="openai")
        provider.api_key = KEY
        provider.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        provider.save()
        project = make_project(owner, provider, model="gpt-image-1")
        [job] = make_drafts(project)
        with caplog.at_level(logging.DEBUG):
            jobs_start(user=owner, project=project, all_drafts=True)
            inline_tasks.run()
    finally:
        server.shutdown()
        server.server_close()
    job.refresh_from_db()
    assert job.status == Status.FAILED and "[redacted]" in job.error, job.error
    stored = job.error + " ".join(job.attempt_log.values_list("reason", flat=True))
    stored += json.dumps(list(job.project.events.values_list("payload", flat=True)))
    assert leaks(stored, KEY) == [] and leaks(caplog.text, KEY) == []


# --- a ComfyUI instance that echoes its password ------------------------------------------------


def _comfy_echo(password_forms):
    class Echo(BaseHTTPRequestHandler):
        def _json(self, status, payload):
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            message = "auth failed for " + " / ".join(password_forms)
            error = {"node_id": "3", "node_type": "KSampler", "exception_type": "RuntimeError", "exception_message": message}
            self._json(200, {"p-1": {"status": {"status_str": "error", "messages": [["execution_error", error]]}}})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            message = "bad value " + password_forms[0].upper()
            echo = {"type": "value_not_valid", "message": message, "details": "", "extra_info": {}}
            self._json(400, {"error": {"message": "invalid"}, "node_errors": {"6": {"class_type": "X", "errors": [echo]}}})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.mark.django_db
def test_comfyui_credentials_echoed_by_the_instance_are_redacted(settings):
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    server = _comfy_echo([PASSWORD, basic, quote(PASSWORD)])
    port = server.server_address[1]
    try:
        settings.OUTBOUND_ALLOWLIST = [f"127.0.0.1:{port}"]
        settings.OUTBOUND_ALLOW_HTTP = True
        # Credentials in the address (sent as HTTP Basic) and a bcrypt-style token.
        client = comfy.ComfyClient(f"http://alice:{PASSWORD}@127.0.0.1:{port}")
        reason, _ = comfy.describe_failure(client.history("p-1"))
        with pytest.raises(comfy.Rejected) as rejected:
            client.post_prompt({}, prompt_id="p-1", client_id="c", extra={})
    finally:
        server.shutdown()
        server.server_close()
    assert "[redacted]" in reason
    for text in (reason, rejected.value.reason, json.dumps(rejected.value.body)):
        assert leaks(text, PASSWORD) == [] and basic not in text
    assert PASSWORD not in client.address and client.address == f"http://127.0.0.1:{port}"


# --- signed URLs -------------------------------------------------------------------------------


def test_a_failed_download_of_a_signed_url_names_only_its_host(settings):
    class Gone(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gone)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    port = server.server_address[1]
    signed = f"http://127.0.0.1:{port}/out/img.png?X-Amz-Signature=SIGNATURE0123456789&X-Amz-Credential=CRED"
    try:
        settings.OUTBOUND_ALLOWLIST = [f"127.0.0.1:{port}"]
        settings.OUTBOUND_ALLOW_HTTP = True
        with pytest.raises(net.requests.HTTPError) as failed:
            net.download(signed)
        with pytest.raises(net.requests.ConnectionError) as refused:
            settings.OUTBOUND_ALLOWLIST = ["127.0.0.1:9"]
            net.download("http://127.0.0.1:9/out/img.png?X-Amz-Signature=SIGNATURE0123456789")
    finally:
        server.shutdown()
        server.server_close()
    for error in (failed.value, refused.value):
        assert "SIGNATURE0123456789" not in str(error) and "/out/img.png" not in str(error)
    assert "404" in str(failed.value) and "refused" in str(refused.value).lower()


def test_the_log_format_cuts_every_url_to_its_host():
    formatter = next(
        handler.formatter for handler in logging.getLogger().handlers if isinstance(handler.formatter, crypto.RedactingFormatter)
    )
    try:
        raise ValueError("failed for url: https://cdn.example.com/o/abc.png?sig=SIGNATURE0123456789")
    except ValueError:
        record = logging.LogRecord("queue_app", logging.WARNING, __file__, 1, "job %s: %s", ("j-1", "x"), exc_info=True)
        import sys

        record.exc_info = sys.exc_info()
    line = formatter.format(record)
    assert "SIGNATURE0123456789" not in line and "https://cdn.example.com/[…]" in line and "job j-1" in line


def test_a_decrypted_key_quoted_by_an_exception_never_reaches_the_log_output():
    formatter = next(
        handler.formatter for handler in logging.getLogger().handlers if isinstance(handler.formatter, crypto.RedactingFormatter)
    )
    key = crypto.decrypt(crypto.encrypt("sk-proj-TRACEBACKKEY0123456789"))  # as a provider's key is read
    try:
        raise RuntimeError(f"Incorrect API key provided: {key}")
    except RuntimeError:
        import sys

        record = logging.LogRecord("queue_app", logging.ERROR, __file__, 1, "submit failed", (), exc_info=sys.exc_info())
    line = formatter.format(record)
    assert "RuntimeError: Incorrect API key provided: [redacted]" in line
    assert "TRACEBACKKEY" not in line and "0123456789" not in line


def test_an_unreachable_comfyui_message_shows_only_scheme_host_and_port(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    address = "http://user:secret-pass@127.0.0.1:9/proxy?token=tok-secret-123"
    with pytest.raises(comfy.Unreachable) as unreachable:
        comfy.ComfyClient(address).queue()
    message = str(unreachable.value)
    assert "Cannot reach ComfyUI at http://127.0.0.1:9 (" in message
    assert "secret" not in message and "user" not in message and "/proxy" not in message
    assert crypto.origin(address) == "http://127.0.0.1:9" and crypto.origin("not a url") == "[address]"


@pytest.mark.parametrize("url", ["http://user:secret-pw@[::1", "user:secret-pw@host/x", "http://user:secret-pw@host:99999/?t=1"])
def test_a_refused_url_is_quoted_without_its_credentials(url):
    with pytest.raises(net.UnsafeURL) as refused:
        net.check_url(url)
    assert "secret-pw" not in str(refused.value)


def test_the_log_format_drops_credentials_in_an_address():
    assert crypto.scrub_urls("at http://user:secret-pw@host:8188 now") == "at http://host:8188 now"
