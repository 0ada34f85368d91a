"""A fake ComfyUI 0.3.64 server, built from the recordings in shared/comfyui/recorded.

It replays the recorded shapes (POST /prompt answers and 400 `node_errors`, 5-array queue
items, `200 {}` for unknown history ids, history entries with status messages, the
/upload/image same-name/same-hash rules, /view with Range, /system_stats, the WebSocket
message sequence with clientId routing) and runs prompts one at a time in `number` order.

Scripted per prompt (`plan(Script(...), ...)`, FIFO; then `default`):
    ok, slow (seconds=…), error (execution_error), oom, invalid (400), hang (until
    interrupted), interrupt, history_gap=N (`{}` for N history reads after it finished),
    steps=N (`progress` messages over the run)
and per instance: refuse()/accept() (nothing listens), forget()/restart() (what a restart
does: queue, history and the prompt counter gone, files kept), upload_delay, drop_next(n) (connections closed
without an answer), fail_next(n) (500 text/plain, as ComfyUI's own), stall_downloads
(seconds of silence after the first chunk of a /view body).
Records: posted prompts, uploads, the peak number of prompts queued or running, and each
run's start and end (monotonic) for idle-time measurements.
"""

import asyncio
import copy
import hashlib
import json
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

from aiohttp import WSMsgType, web

# A copy of ../shared/comfyui/recorded (real ComfyUI 0.3.64 answers), kept in the repository
# so the suite does not depend on where the checkout sits.
RECORDED = Path(__file__).resolve().parent / "comfyui_recorded"
OUTPUT_NODES = ("SaveImage", "PreviewImage", "SaveVideo", "VHS_VideoCombine", "SaveAnimatedWEBP")
ERROR_500 = "500 Internal Server Error\n\nServer got itself in trouble"


def _recorded(name: str):
    path = RECORDED / name
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_bytes()


def _step(scenario: str, method: str, path_prefix: str, status: int | None = None) -> dict:
    for step in _recorded(scenario)["steps"]:
        request = step["request"]
        if request["method"] == method and request["path"].startswith(path_prefix):
            if status is None or step["status"] == status:
                return step
    raise LookupError(f"{scenario}: no {method} {path_prefix}")


def png_of_size(size: int) -> bytes:
    """The recorded 64x64 output PNG, padded with a private chunk to `size` bytes (still a valid PNG)."""
    base = _recorded("success_output.png")
    if size <= len(base):
        return base
    pad = size - len(base) - 12
    body = b"prIv" + b"\0" * pad
    chunk = struct.pack(">I", pad) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    iend = base.rindex(b"IEND") - 4
    return base[:iend] + chunk + base[iend:]


@dataclass
class Script:
    kind: str = "ok"  # ok | error | oom | invalid | hang | interrupt
    seconds: float = 0.02
    history_gap: int = 0
    images: int = 1
    image_bytes: int = 0
    video: bool = False
    steps: int = 0  # `progress` messages value 0..steps-1 of `steps`, spread over the run (12_binary_preview_frames)


class FakeComfyUI:
    def __init__(self, *, password: str = "", token: str = ""):
        self.password, self.token = password, token
        self.default = Script()
        self.scripts: list[Script] = []
        self.stall_downloads = 0.0
        self._drop = 0
        self._fail = 0
        self.posted: list[dict] = []
        self.uploads: list[tuple[str, str]] = []
        self.views: list[str] = []
        self.max_in_flight = 0
        self.runs: list[dict] = []
        self.history: dict[str, dict] = {}
        self._gaps: dict[str, int] = {}
        self.files: dict[tuple[str, str, str], bytes] = {}
        self.pending: list[list] = []
        self.running: list | None = None
        self._number = 0
        self._counter = -1  # the first prompt is number 0, as recorded
        self.restarts = 0
        self.upload_delay = 0.0  # seconds an upload takes (to overlap two of them)
        self.input_checks: list[str] = []
        self._sockets: dict[str, web.WebSocketResponse] = {}
        self._sessions: set[str] = set()
        self._interrupt: str | None = None
        self._wake = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-comfyui", daemon=True)
        self.port = 0
        self._stats = _step("01_basics.json", "GET", "/system_stats")["body"]
        self._invalid = _step("07_validation_errors.json", "POST", "/prompt", 400)["body"]
        self._exec_error = self._recorded_error()

    # --- lifecycle ---

    def start(self) -> "FakeComfyUI":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self):
        self._wake = asyncio.Event()
        app = web.Application(middlewares=[self._middleware], client_max_size=200 * 1024 * 1024)
        for prefix in ("", "/api"):
            app.router.add_get(prefix + "/system_stats", self.system_stats)
            app.router.add_post(prefix + "/prompt", self.post_prompt)
            app.router.add_get(prefix + "/queue", self.get_queue)
            app.router.add_post(prefix + "/queue", self.post_queue)
            app.router.add_get(prefix + "/history/{prompt_id}", self.get_history)
            app.router.add_get(prefix + "/history", self.list_history)
            app.router.add_post(prefix + "/interrupt", self.post_interrupt)
            app.router.add_post(prefix + "/upload/image", self.upload)
            app.router.add_get(prefix + "/view", self.view)
        app.router.add_get("/ws", self.websocket)
        app.router.add_post("/login", self.login)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True)
        await self.site.start()
        self.port = self.site._server.sockets[0].getsockname()[1]
        self._executor = asyncio.ensure_future(self._execute())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        async def _stop():
            self._executor.cancel()
            for socket in list(self._sockets.values()):
                await socket.close()
            await self.runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    def refuse(self) -> None:
        """Stop listening and close open connections: clients get 'connection refused'."""

        async def _refuse():
            await self.site.stop()
            for handler in list(self.runner.server.connections):
                handler.force_close()

        self._call(_refuse())

    def forget(self) -> None:
        """What a restart does to ComfyUI's memory (17_server_restart): the queue and the
        history are gone (the running prompt never finishes), the prompt `number` counter
        starts again at 0, sockets close (1006), temp files are wiped; output and input
        files stay on disk and /view serves them."""

        async def _forget():
            self._executor.cancel()
            self.pending.clear()
            self.running = None
            self.history.clear()
            self._gaps.clear()
            self._counter = -1
            self._interrupt = None
            self.files = {key: data for key, data in self.files.items() if key[0] != "temp"}
            for socket in list(self._sockets.values()):
                await socket.close(code=1006)
            self._sockets.clear()
            self.restarts += 1
            self._executor = asyncio.ensure_future(self._execute())

        self._call(_forget())

    def restart(self) -> None:
        """Stop, forget everything held in memory, and answer again."""
        self.refuse()
        self.forget()
        self.accept()

    def accept(self) -> None:
        async def _accept():
            self.site = web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True)
            await self.site.start()

        self._call(_accept())

    # --- scripting ---

    def plan(self, *scripts: Script) -> None:
        self.scripts.extend(scripts)

    def drop_next(self, n: int) -> None:
        self._drop = n

    def fail_next(self, n: int) -> None:
        self._fail = n

    def in_flight(self) -> int:
        return len(self.pending) + (1 if self.running else 0)

    def interrupt_all(self) -> None:
        self._interrupt = "*"

    # --- HTTP ---

    @web.middleware
    async def _middleware(self, request, handler):
        if self._drop > 0 and request.path != "/ws":
            self._drop -= 1
            request.transport.close()
            return web.Response(status=500)
        if self._fail > 0 and request.method == "GET" and request.path.startswith(("/queue", "/history")):
            self._fail -= 1
            return web.Response(status=500, text=ERROR_500, headers={"Connection": "close"})
        if self.password and request.path != "/login" and not self._authorised(request):
            return web.Response(status=401, text="Unauthorized")
        return await handler(request)

    def _authorised(self, request) -> bool:
        if self.token and request.headers.get("Authorization") == f"Bearer {self.token}":
            return True
        return request.cookies.get("session") in self._sessions

    async def login(self, request):
        form = await request.post()
        if form.get("password") != self.password:
            return web.Response(status=401, text="wrong password")
        session = uuid.uuid4().hex
        self._sessions.add(session)
        response = web.HTTPFound("/")
        response.set_cookie("session", session)
        raise response

    async def system_stats(self, request):
        return web.json_response(self._stats)

    async def post_prompt(self, request):
        try:
            body = json.loads(await request.text())
        except ValueError:
            return web.Response(status=500, text=ERROR_500, headers={"Connection": "close"})
        if not isinstance(body, dict) or "prompt" not in body:
            return web.json_response(
                {
                    "error": {"type": "no_prompt", "message": "No prompt provided", "details": "", "extra_info": {}},
                    "node_errors": {},
                },
                status=400,
            )
        graph = body["prompt"]
        if not isinstance(graph, dict):
            return web.Response(status=500, text=ERROR_500, headers={"Connection": "close"})
        self._counter += 1
        number = self._counter
        script = self.scripts.pop(0) if self.scripts else self.default
        self.posted.append({"prompt_id": body.get("prompt_id"), "body": body, "script": script})
        for node_id, node in graph.items():
            if not isinstance(node, dict) or "class_type" not in node:
                error = {"type": "invalid_prompt", "message": "Cannot execute because a node is missing the class_type property.",
                         "details": f"Node ID '#{node_id}'", "extra_info": {}}  # fmt: skip
                return web.json_response({"error": error, "node_errors": {}}, status=400)
        if script.kind == "invalid":
            answer = copy.deepcopy(self._invalid)
            first = next(iter(graph))
            answer["node_errors"] = {first: {**answer["node_errors"]["1"], "class_type": graph[first]["class_type"]}}
            return web.json_response(answer, status=400)
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        extra = dict(body.get("extra_data") or {})
        if body.get("client_id"):
            extra["client_id"] = body["client_id"]
        outputs = [node_id for node_id, node in graph.items() if node.get("class_type") in OUTPUT_NODES]
        self.pending.append([number, prompt_id, graph, extra, outputs, script])
        self.max_in_flight = max(self.max_in_flight, self.in_flight())
        await self._broadcast_status()
        self._wake.set()
        return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": {}})

    def _queue_item(self, item):
        return item[:5]

    async def get_queue(self, request):
        running = [self._queue_item(self.running)] if self.running else []
        return web.json_response({"queue_running": running, "queue_pending": [self._queue_item(i) for i in self.pending]})

    async def post_queue(self, request):
        try:
            body = json.loads(await request.text())
        except ValueError:
            return web.Response(status=500, text=ERROR_500, headers={"Connection": "close"})
        for prompt_id in body.get("delete") or []:
            for item in self.pending:
                if item[1] == prompt_id:  # only the first pending item with that id
                    self.pending.remove(item)
                    break
        if body.get("clear"):
            self.pending.clear()
        return web.Response(status=200)

    async def get_history(self, request):
        prompt_id = request.match_info["prompt_id"]
        entry = self.history.get(prompt_id)
        if entry is None:
            return web.json_response({})
        if self._gaps.get(prompt_id, 0) > 0:
            self._gaps[prompt_id] -= 1
            return web.json_response({})
        return web.json_response({prompt_id: entry})

    async def list_history(self, request):
        """`?max_items=N`: the N most recent entries, oldest first (16_history_listing_and_misc)."""
        try:
            count = int(request.query.get("max_items", len(self.history)))
        except ValueError:
            return web.Response(status=500, text=ERROR_500, headers={"Connection": "close"})
        items = list(self.history.items())[-count:] if count > 0 else []
        return web.json_response(dict(items))

    async def post_interrupt(self, request):
        try:
            body = json.loads(await request.text() or "null")
        except ValueError:
            body = None
        target = body.get("prompt_id") if isinstance(body, dict) else None
        if target is None or (self.running and self.running[1] == target):
            self._interrupt = target or "*"
        return web.Response(status=200)

    async def upload(self, request):
        form = await request.post()
        image = form.get("image")
        if image is None or not hasattr(image, "file"):
            return web.Response(status=400)
        folder, subfolder = form.get("type", "input"), form.get("subfolder", "")
        if ".." in image.filename or ".." in subfolder:
            return web.Response(status=400)
        data = image.file.read()
        if self.upload_delay:
            await asyncio.sleep(self.upload_delay)
        name, index = image.filename, 0
        stem, dot, ext = image.filename.rpartition(".")
        overwrite = form.get("overwrite") in ("true", "1")
        while not overwrite and (folder, subfolder, name) in self.files:
            if self.files[(folder, subfolder, name)] == data:
                break  # an existing file with the same bytes is returned, nothing is written
            index += 1
            name = f"{stem} ({index}){dot}{ext}"
        self.files[(folder, subfolder, name)] = data
        self.uploads.append((image.filename, hashlib.sha256(data).hexdigest()))
        return web.json_response({"name": name, "subfolder": subfolder, "type": folder})

    async def view(self, request):
        query = request.query
        if not query.get("filename"):
            return web.Response(status=404)
        if ".." in query["filename"]:
            return web.Response(status=400)
        key = (query.get("type", "output"), query.get("subfolder", ""), query["filename"])
        if key[0] == "input":
            self.input_checks.append(key[2])
            if self.upload_delay:
                await asyncio.sleep(self.upload_delay / 2)  # a slow disk: the check and the upload overlap
        data = self.files.get(key)
        if data is None:
            return web.Response(status=404)
        self.views.append(query["filename"])
        content_type = "video/mp4" if key[2].endswith(".mp4") else "image/png"
        headers = {"Content-Disposition": f'filename="{key[2]}"', "Accept-Ranges": "bytes"}
        if request.headers.get("Range") == "bytes=0-0":
            headers["Content-Range"] = f"bytes 0-0/{len(data)}"
            return web.Response(status=206, body=data[:1], content_type=content_type, headers=headers)
        response = web.StreamResponse(status=200, headers={**headers, "Content-Type": content_type})
        response.content_length = len(data)
        await response.prepare(request)
        first = 64 * 1024
        await response.write(data[:first])
        if self.stall_downloads:
            await asyncio.sleep(self.stall_downloads)
        await response.write(data[first:])
        await response.write_eof()
        return response

    async def websocket(self, request):
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        client_id = request.query.get("clientId") or uuid.uuid4().hex
        self._sockets[client_id] = socket
        await socket.send_json(
            {"type": "status", "data": {"status": {"exec_info": {"queue_remaining": self.in_flight()}}, "sid": client_id}}
        )
        try:
            async for message in socket:
                if message.type == WSMsgType.ERROR:
                    break
        finally:
            # ComfyUI drops the clientId even when a newer socket owns it (02b): copied.
            self._sockets.pop(client_id, None)
        return socket

    async def _send(self, client_id, kind, data):
        socket = self._sockets.get(client_id) if client_id else None
        if socket is not None and not socket.closed:
            try:
                await socket.send_json({"type": kind, "data": data})
            except ConnectionError:
                pass

    async def _broadcast_status(self):
        for client_id in list(self._sockets):
            await self._send(client_id, "status", {"status": {"exec_info": {"queue_remaining": self.in_flight()}}})

    # --- execution ---

    def _recorded_error(self) -> dict:
        entry = next(iter(_step("06_execution_error.json", "GET", "/history/")["body"].values()))
        return dict(entry["status"]["messages"][-1][1])

    async def _execute(self):
        while True:
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.pending.sort(key=lambda item: item[0])
            self.running = self.pending.pop(0)
            number, prompt_id, graph, extra, outputs, script = self.running
            client_id = extra.get("client_id")
            started = time.monotonic()
            stamp = int(time.time() * 1000)
            messages = [["execution_start", {"prompt_id": prompt_id, "timestamp": stamp}],
                        ["execution_cached", {"nodes": [], "prompt_id": prompt_id, "timestamp": stamp}]]  # fmt: skip
            for name, data in messages:
                await self._send(client_id, name, data)
            first_node = next(iter(graph))
            await self._send(client_id, "executing", {"node": first_node, "display_node": first_node, "prompt_id": prompt_id})
            interrupted = False
            deadline = started + (1e9 if script.kind == "hang" else script.seconds)
            step = 0
            while time.monotonic() < deadline:
                if self._interrupt in ("*", prompt_id) or script.kind == "interrupt":
                    interrupted = True
                    break
                if step < script.steps and time.monotonic() >= started + script.seconds * step / script.steps:
                    # as recorded: value 0..max-1 of max, never max/max, from the node running
                    data = {"value": step, "max": script.steps, "prompt_id": prompt_id, "node": first_node}
                    await self._send(client_id, "progress", data)
                    step += 1
                await asyncio.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
            self._interrupt = None
            node_outputs, status = {}, None
            if interrupted:
                data = {"prompt_id": prompt_id, "node_id": first_node, "node_type": graph[first_node]["class_type"],
                        "executed": [], "timestamp": int(time.time() * 1000)}  # fmt: skip
                messages.append(["execution_interrupted", data])
                status = {"status_str": "error", "completed": False, "messages": messages}
                await self._send(client_id, "execution_interrupted", data)
            elif script.kind in ("error", "oom"):
                data = {**self._exec_error, "prompt_id": prompt_id, "node_id": first_node,
                        "node_type": graph[first_node]["class_type"], "timestamp": int(time.time() * 1000)}  # fmt: skip
                if script.kind == "oom":
                    data.update(
                        exception_type="torch.OutOfMemoryError",
                        exception_message="Allocation on device \nThis error means you ran out of memory on your GPU.\n\n"
                        "TIPS: If the workflow worked before you might have accidentally set the batch_size to a large number.",
                    )
                messages.append(["execution_error", data])
                status = {"status_str": "error", "completed": False, "messages": messages}
                await self._send(client_id, "execution_error", data)
            else:
                node_outputs = self._write_outputs(graph, outputs, script)
                for node_id, produced in node_outputs.items():
                    await self._send(
                        client_id,
                        "executed",
                        {"node": node_id, "display_node": node_id, "output": produced, "prompt_id": prompt_id},
                    )
                success = {"prompt_id": prompt_id, "timestamp": int(time.time() * 1000)}
                messages.append(["execution_success", success])
                status = {"status_str": "success", "completed": True, "messages": messages}
                # As recorded: execution_success goes out before the history entry is written.
                await self._send(client_id, "execution_success", success)
            # task_done: the history entry is written and the prompt leaves the queue together.
            self.history[prompt_id] = {
                "prompt": [number, prompt_id, graph, extra, outputs],
                "outputs": node_outputs,
                "status": status,
                "meta": {n: {"node_id": n, "display_node": n, "parent_node": None, "real_node_id": n} for n in node_outputs},
            }
            if script.history_gap:
                self._gaps[prompt_id] = script.history_gap
            self.running = None
            self.runs.append({"prompt_id": prompt_id, "started": started, "ended": time.monotonic(), "kind": script.kind})
            await self._broadcast_status()
            await self._send(client_id, "executing", {"node": None, "prompt_id": prompt_id})

    def _write_outputs(self, graph, outputs, script: Script) -> dict:
        produced = {}
        data = png_of_size(script.image_bytes)
        for node_id in outputs:
            kind = "temp" if graph[node_id]["class_type"] == "PreviewImage" else "output"
            prefix = str(graph[node_id].get("inputs", {}).get("filename_prefix", "ComfyUI_temp_fake"))
            subfolder, _, stem = prefix.rpartition("/")
            images = []
            for _ in range(script.images):
                self._number += 1
                filename = f"{stem}_{self._number:05d}_.png"
                self.files[(kind, subfolder, filename)] = data
                images.append({"filename": filename, "subfolder": subfolder, "type": kind})
            produced[node_id] = {"images": images}
            if script.video:
                self._number += 1
                filename = f"{stem}_{self._number:05d}.mp4"
                self.files[(kind, subfolder, filename)] = b"\x00\x00\x00\x18ftypmp42" + b"\0" * 64
                produced[node_id]["gifs"] = [
                    {"filename": filename, "subfolder": subfolder, "type": kind, "format": "video/h264-mp4"}
                ]
        return produced


# The workflow of the recordings (03_success_invert_save), API format.
WORKFLOW = _step("03_success_invert_save.json", "POST", "/prompt")["request"]["body"]["prompt"]
