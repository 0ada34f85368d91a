"""Bounded bodies at the door (remixstudio/edge.py, remixstudio/daphne_edge.py): every
route, signed in or not, refuses a body over its bound before reading it — by its
Content-Length, and while it streams — and WebSocket messages are bounded too; the web
process's memory stays where it was while a 200 MB body is refused; accepted uploads
stream to disk; the access log never carries a query string (search words are prompts)."""

import io
import json
import os
import socket
import threading
import time

import psutil
import pytest
from asgiref.testing import ApplicationCommunicator
from PIL import Image

from queue_app import limits
from remixstudio import edge
from tests import procs

MB = 1024 * 1024


# --- the middleware, in process ------------------------------------------------------------


class _App:
    """An ASGI app that reads the whole body and answers its length."""

    def __init__(self):
        self.read = 0

    async def __call__(self, scope, receive, send):
        while True:
            message = await receive()
            self.read += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(self.read).encode()})


def http_scope(path: str, length: int | None) -> dict:
    headers = [(b"content-length", str(length).encode())] if length is not None else []
    return {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b""}


async def run(app, scope, chunks):
    communicator = ApplicationCommunicator(app, scope)
    for n, chunk in enumerate(chunks):
        await communicator.send_input({"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1})
    start = await communicator.receive_output(5)
    body = await communicator.receive_output(5)
    await communicator.wait(5)
    return start["status"], body["body"]


@pytest.mark.asyncio
async def test_a_declared_length_over_the_bound_is_refused_before_a_byte_is_read():
    inner = _App()
    status, body = await run(edge.BodyLimit(inner), http_scope("/projects/", limits.BODY_BYTES + 1), [b"x"])
    assert status == 413 and b"limit here is" in body and inner.read == 0
    status, body = await run(edge.BodyLimit(inner), http_scope("/api/projects", limits.BODY_BYTES + 1), [b"x"])
    assert status == 413 and "limit here is" in json.loads(body)["error"]


@pytest.mark.asyncio
async def test_a_body_streaming_past_the_bound_is_cut_off():
    inner = _App()
    chunk = b"x" * MB
    chunks = [chunk] * (limits.BODY_BYTES // MB + 2)
    status, _ = await run(edge.BodyLimit(inner), http_scope("/accounts/login/", None), chunks)
    assert status == 413 and inner.read <= limits.BODY_BYTES
    fits = await run(edge.BodyLimit(_App()), http_scope("/accounts/login/", None), [chunk] * 2)
    assert fits == (200, str(2 * MB).encode())


@pytest.mark.django_db
def test_upload_routes_take_the_upload_bound_and_every_other_route_the_body_bound(project):
    assert edge.limit_for(f"/projects/{project.id}/drafts") == limits.UPLOAD_BYTES + limits.FORM_BYTES
    assert edge.limit_for("/api/references") == limits.UPLOAD_BYTES + limits.FORM_BYTES
    assert limits.REFERENCE_BYTES < limits.UPLOAD_BYTES
    for path in ("/projects/", "/api/projects", "/mcp", "/admin/", "/no/such/route", f"/projects/{project.id}/comfyui/"):
        assert edge.limit_for(path) == limits.BODY_BYTES, path
    assert limits.REQUEST_BYTES < limits.BODY_BYTES and limits.WORKFLOW_FILE_BYTES < limits.BODY_BYTES


@pytest.mark.asyncio
async def test_a_websocket_message_over_the_bound_closes_the_socket():
    received = []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            received.append(message["type"])
            if message["type"] == "websocket.disconnect":
                return

    communicator = ApplicationCommunicator(edge.BodyLimit(app), {"type": "websocket", "path": "/ws/x/", "headers": []})
    await communicator.send_input({"type": "websocket.receive", "text": "ping"})
    await communicator.send_input({"type": "websocket.receive", "text": "x" * (limits.WEBSOCKET_MESSAGE_BYTES + 1)})
    closed = await communicator.receive_output(5)
    await communicator.wait(5)
    assert closed == {"type": "websocket.close", "code": 1009}
    assert received == ["websocket.receive", "websocket.disconnect"]


# --- the real web process ---------------------------------------------------------------------


class Sampler:
    """The highest RSS of a process, sampled every 20 ms in a thread."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def send_body(url: str, path: str, size: int, *, chunked: bool = False, headers: str = "") -> bytes:
    """POST `size` bytes of junk to `path`; what came back (the status line and on)."""
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary=x\r\n{framing}\r\n"
    sock.sendall((head + headers + "\r\n").encode())
    piece, sent = b"x" * MB, 0
    try:
        while sent < size:
            sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n" if chunked else piece)
            sent += len(piece)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server stopped reading after its 413: what it said is still there to read
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except OSError:
        pass
    sock.close()
    return answer


def idle_rss(web) -> int:
    import requests

    for _ in range(3):  # warm: the first requests import and cache what every request needs
        requests.get(f"{web.url}/healthz", timeout=10)
    return psutil.Process(web.pid).memory_info().rss


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_the_web_process_refuses_a_200_mb_body_without_growing(tmp_path):
    web = procs.daphne(tmp_path / "logs")
    try:
        idle = idle_rss(web)
        peaks = {}
        for name, path, chunked in (
            ("page, Content-Length", "/accounts/login/", False),
            ("upload route, chunked", "/projects/1/drafts", True),
            ("API, Content-Length", "/api/references", False),
        ):
            with Sampler(web.pid) as sampler:
                answer = send_body(web.url, path, 200 * MB, chunked=chunked)
            assert answer.startswith(b"HTTP/1.1 413"), (name, answer[:200])
            peaks[name] = sampler.peak
        print(f"\nweb RSS idle {idle / MB:.1f} MB; peak while a 200 MB body was refused:")
        for name, peak in peaks.items():
            print(f"  {name}: {peak / MB:.1f} MB (+{(peak - idle) / MB:.1f} MB)")
        assert all(peak - idle < 50 * MB for peak in peaks.values()), peaks
    finally:
        web.stop()


def noise_png(target_bytes: int) -> bytes:
    side = int((target_bytes / 3) ** 0.5)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG", compress_level=0)
    return out.getvalue()


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_an_accepted_upload_streams_to_disk_and_costs_no_more_than_a_few_mb(tmp_path, owner):
    import requests

    from queue_app.models import Reference
    from queue_app.web import tokens

    raw = tokens.token_create(user=owner, name="upload")[1]
    picture = noise_png(limits.REFERENCE_BYTES - 500_000)
    web = procs.daphne(tmp_path / "logs")
    try:
        idle = idle_rss(web)
        with Sampler(web.pid) as sampler:
            answer = requests.post(
                f"{web.url}/api/references",
                files={"file": ("big.png", picture, "image/png")},
                headers={"Authorization": f"Bearer {raw}"},
                timeout=120,
            )
        assert answer.status_code == 201, web.log()[-3000:]
        print(
            f"\nweb RSS idle {idle / MB:.1f} MB; peak while a {len(picture) / MB:.1f} MB reference was stored: "
            f"{sampler.peak / MB:.1f} MB (+{(sampler.peak - idle) / MB:.1f} MB)"
        )
        assert sampler.peak - idle < 50 * MB
        assert Reference.objects.get().size == len(picture)
    finally:
        web.stop()


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_the_access_log_names_paths_without_their_query(tmp_path):
    import requests

    web = procs.daphne(tmp_path / "logs")
    try:
        for url in ("/queue/?q=the+blue+heron+of+lake+vanern", "/projects/1/?q=heron&state=all", "/healthz?heron=1"):
            requests.get(f"{web.url}{url}", timeout=10, allow_redirects=False)
        procs.wait_for(lambda: web.log().count('"GET /') >= 3, timeout=10, message="three access log lines")
    finally:
        web.stop()
    log = web.log()
    assert '"GET /queue/"' in log and '"GET /healthz"' in log
    assert "heron" not in log.lower()
