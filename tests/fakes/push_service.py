"""A fake Web Push service (RFC 8030) on loopback, and a fake device to subscribe with.

The service decrypts nothing: it records every POST (path, headers, body) and answers with
201 Created, or with the status a test set for that path (410 Gone for an unsubscribed
device, 500, 429…), optionally only once the test releases it (a slow service). The
device holds what a browser holds — a P-256 key pair and an auth secret — so a test can
read a recorded message the way the browser would (aes128gcm).

    with PushService() as service:
        device = Device(service.endpoint("phone"))
        ...subscribe with device.subscription_info()...
        [message] = device.messages(service)
"""

import base64
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


@dataclass
class Push:
    path: str
    headers: dict
    body: bytes
    status: int


@dataclass
class PushService:
    host: str = "127.0.0.1"
    pushes: list = field(default_factory=list)
    statuses: dict = field(default_factory=dict)
    holds: dict = field(default_factory=dict)
    extra_headers: dict = field(default_factory=dict)

    def __post_init__(self):
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                hold = service.holds.get(self.path)
                if hold is not None:
                    hold.wait(30)  # a slow push service: answers when the test releases it
                status = service.statuses.get(self.path, 201)
                with service._lock:
                    service.pushes.append(Push(self.path, {k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                if status == 201:
                    self.send_header("location", f"/message{self.path}/{len(service.pushes)}")
                for name, value in service.extra_headers.get(self.path, {}).items():
                    self.send_header(name, value)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def origin(self) -> str:
        return f"http://{self.host}:{self.port}"

    def endpoint(self, name: str) -> str:
        # Real endpoints end in an unguessable token; so do ours.
        return f"{self.origin}/push/{name}-{base64.urlsafe_b64encode(os.urandom(12)).decode().rstrip('=')}"

    def respond(self, endpoint: str, status: int, headers: dict | None = None) -> None:
        """Answer every later push to `endpoint` with `status` (and `headers`: Retry-After…)."""
        self.statuses[endpoint[len(self.origin) :]] = status
        self.extra_headers[endpoint[len(self.origin) :]] = headers or {}

    def hold(self, endpoint: str) -> threading.Event:
        """Keep every later push to `endpoint` waiting until the returned event is set."""
        event = threading.Event()
        self.holds[endpoint[len(self.origin) :]] = event
        return event

    def received(self, endpoint: str | None = None) -> list[Push]:
        with self._lock:
            pushes = list(self.pushes)
        if endpoint is None:
            return pushes
        return [push for push in pushes if push.path == endpoint[len(self.origin) :]]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Device:
    """A browser's side of a subscription."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.private_key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)

    def subscription_info(self) -> dict:
        public = self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return {"endpoint": self.endpoint, "keys": {"p256dh": _b64(public), "auth": _b64(self.auth)}}

    def decrypt(self, push: Push) -> dict:
        assert push.headers.get("content-encoding") == "aes128gcm", push.headers
        return json.loads(http_ece.decrypt(push.body, private_key=self.private_key, auth_secret=self.auth, version="aes128gcm"))

    def messages(self, service: PushService, *, delivered_only: bool = True) -> list[dict]:
        """What this device was sent (and, by default, what the service accepted)."""
        return [self.decrypt(p) for p in service.received(self.endpoint) if not delivered_only or p.status == 201]
