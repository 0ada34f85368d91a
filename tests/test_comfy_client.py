"""The ComfyUI client against the recorded shapes, the streamed download, the WebSocket
end-of-run rule, and the connection test (bcrypt token versus form login)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from comfy_app import client as comfy
from comfy_app import ws
from queue_app.providers import net
from tests.fakes.comfyui import RECORDED, FakeComfyUI


def recorded(name):
    return json.loads((RECORDED / name).read_text())


@pytest.fixture
def allow_loopback(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]


def test_every_recorded_validation_error_names_its_node_and_input():
    rejected = [s for s in recorded("07_validation_errors.json")["steps"] if s["status"] == 400 and s["body"].get("node_errors")]
    assert len(rejected) >= 6
    for step in rejected:
        reason = comfy.describe_rejection(step["body"])
        node_id, node = next(iter(step["body"]["node_errors"].items()))
        assert f"node {node_id} ({node['class_type']})" in reason
        assert f"input '{node['errors'][0]['extra_info']['input_name']}'" in reason


def test_a_rejection_without_node_errors_reads_the_error_message():
    step = next(
        s for s in recorded("07_validation_errors.json")["steps"] if s["status"] == 400 and not s["body"].get("node_errors")
    )
    assert comfy.describe_rejection(step["body"]).startswith("ComfyUI rejected the workflow: ")


def test_recorded_execution_error_and_interrupt_are_told_apart():
    error_entry = next(
        iter(
            next(s for s in recorded("06_execution_error.json")["steps"] if "/history/" in s["request"]["path"])["body"].values()
        )
    )
    reason, oom = comfy.describe_failure(error_entry)
    assert reason.startswith("ComfyUI error in node 2 (ImageToMask): IndexError: index 3") and not oom
    interrupted = [
        next(iter(s["body"].values()))
        for s in recorded("09_queue_interrupt_delete.json")["steps"]
        if "/history/" in s["request"]["path"] and s["body"]
    ]
    reason, _ = comfy.describe_failure(interrupted[0])
    assert "interrupted on the ComfyUI instance (at node 12 (ImageBlur))" in reason


def test_only_the_end_of_a_run_counts_as_done_on_the_socket():
    messages = [m["message"] for m in recorded("03_success_invert_save.json")["ws_messages"] if m["frame"] == "text"]
    done = [m["type"] for m in messages if ws.is_done(m)]
    assert done == ["execution_success", "executing"]
    # after a reconnect mid-run, `executing` has no prompt_id: not an end
    assert not ws.is_done({"type": "executing", "data": {"node": "11"}})


def test_the_queue_and_history_quirks(allow_loopback):
    fake = FakeComfyUI().start()
    try:
        client = comfy.ComfyClient(fake.url)
        assert client.queue() == {}
        assert client.history("not a uuid / weird id!") is None  # 200 {} and a percent-encoded path
        fake.pending.append([3, "b", {}, {}, [], None])
        fake.pending.append([-5, "a", {}, {}, [], None])
        assert client.queue() == {"a": "pending", "b": "pending"}
    finally:
        fake.stop()


def test_test_connection_data_from_system_stats(allow_loopback):
    fake = FakeComfyUI().start()
    try:
        stats = comfy.ComfyClient(fake.url).system_stats()
        assert stats["system"]["comfyui_version"] == "0.3.64" and stats["devices"][0]["name"] == "cpu"
    finally:
        fake.stop()


def test_a_bcrypt_password_is_sent_as_a_bearer_token_and_anything_else_logs_in(allow_loopback):
    token = "$2b$12$" + "a" * 53
    fake = FakeComfyUI(password="letmein", token=token).start()
    try:
        assert comfy.ComfyClient(fake.url, password=token).queue() == {}
        assert fake._sessions == set()  # no form login happened
        assert comfy.ComfyClient(fake.url, password="letmein").queue() == {}
        assert len(fake._sessions) == 1
        with pytest.raises(comfy.AuthFailed):
            comfy.ComfyClient(fake.url, password="wrong").queue()
        with pytest.raises(comfy.AuthFailed, match="needs a password"):
            comfy.ComfyClient(fake.url).queue()
    finally:
        fake.stop()


def test_refused_connections_are_unreachable_and_dropped_ones_a_failed_check(allow_loopback):
    fake = FakeComfyUI().start()
    try:
        fake.drop_next(1)
        with pytest.raises(comfy.CheckFailed):
            comfy.ComfyClient(fake.url).queue()
        fake.refuse()
        with pytest.raises(comfy.Unreachable, match="connection refused"):
            comfy.ComfyClient(fake.url).queue()
    finally:
        fake.stop()


def test_an_address_outside_the_allowlist_is_refused(settings):
    settings.OUTBOUND_ALLOWLIST = []
    with pytest.raises(comfy.BadAddress):
        comfy.ComfyClient("http://127.0.0.1:8188").queue()


class Trickle(BaseHTTPRequestHandler):
    """Sends a byte every 50 ms: never idle, but slow."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", "100")
        self.end_headers()
        for _ in range(100):
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(0.05)

    def log_message(self, *args):
        pass


@pytest.fixture
def trickle():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/file"
    server.shutdown()


def test_a_download_past_its_overall_limit_is_abandoned_on_a_controlled_clock(allow_loopback, trickle, tmp_path):
    clock = iter(range(0, 10**6, 60 * 31))  # 31 minutes pass per reading of the clock
    with pytest.raises(net.Stalled, match="longer than 30 minutes"):
        net.stream_to_file(trickle, tmp_path / "f", idle_timeout=60, total_timeout=1800, clock=lambda: next(clock))


def test_a_trickling_download_is_cut_by_the_watchdog_at_its_total_limit(allow_loopback, trickle, tmp_path):
    started = time.monotonic()
    with pytest.raises(net.Stalled, match="longer than"):
        net.stream_to_file(trickle, tmp_path / "f", idle_timeout=2, total_timeout=0.5)
    assert time.monotonic() - started < 4


def test_a_slow_download_inside_its_limits_completes(allow_loopback, trickle, tmp_path):
    size, content_type = net.stream_to_file(trickle, tmp_path / "f", idle_timeout=1, total_timeout=30)
    assert size == 100 and (tmp_path / "f").read_bytes() == b"x" * 100 and content_type == "application/octet-stream"
