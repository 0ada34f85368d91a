"""A local fake of an asynchronous provider API, on loopback, for end-to-end tests.

It speaks RunningHub's v2 shapes (../shared/providers/runninghub.md):
- `POST /openapi/v2/run/workflow/{id}` and `POST /openapi/v2/{endpoint}` → `{"taskId", "status": "RUNNING", …}`;
- `POST /openapi/v2/query` → RUNNING for `polls_before_done` queries, then SUCCESS with one
  `results[]` entry per output (a composite and `layers` layers), or FAILED with
  `fail_code`;
- `GET /files/{task}/{n}.png` → a real PNG (the outputs are downloaded from here), or the
  `file=(bytes, content type)` it was given: a hostile server's bytes under any header;
- `immediate=True`: the submit answers SUCCESS with its results at once (no polling);
- `POST /task/openapi/cancel` with `{"apiKey", "taskId"}` → `{"code": 0}`; the task then
  answers CANCEL, and its id is listed in `cancelled`.
- `GET /openapi/v2/queue/status` (the Test key probe) → the account's queue counts, or
  errorCode 412 (TOKEN_INVALID) when `api_key` is set and the bearer is another key.
Everything it saw is counted, so a test can assert that nothing was submitted twice.

Use it as a context manager; `url` is its base (`http://127.0.0.1:<port>`), so tests put
`http://127.0.0.1:<port>` on OUTBOUND_ALLOWLIST (`fake.host` is `127.0.0.1:<port>`).
"""

import io
import itertools
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image


def png(colour=(200, 30, 30, 255), size=(32, 32)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGBA", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


class FakeAsyncProvider:
    def __init__(
        self,
        *,
        polls_before_done: int = 2,
        layers: int = 0,
        fail_code: str = "",
        file: tuple[bytes, str] | None = None,
        immediate: bool = False,
        api_key: str = "",
    ):
        self.api_key = api_key
        self.polls_before_done = polls_before_done
        self.file = file
        self.immediate = immediate
        self.layers = layers
        self.fail_code = fail_code
        self.tasks: dict[str, dict] = {}
        self.hits = Counter()
        self.bodies: list[dict] = []
        self.cancelled: list[str] = []
        self._ids = itertools.count(2047154150516862978)
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    # --- behaviour ---

    def _submit(self, body: dict) -> dict:
        with self._lock:
            task_id = str(next(self._ids))
            self.tasks[task_id] = {"queries": 0}
            self.bodies.append(body)
        if self.immediate:
            results = self._results(task_id)
            return {"taskId": task_id, "status": "SUCCESS", "errorCode": "", "errorMessage": "", "results": results}
        return {"taskId": task_id, "status": "RUNNING", "errorCode": "", "errorMessage": "", "results": None, "promptTips": ""}

    def _results(self, task_id: str) -> list[dict]:
        return [
            {"url": f"{self.url}/files/{task_id}/{n}.png", "outputType": "png", "nodeId": str(9 + n), "text": None}
            for n in range(1 + self.layers)
        ]

    def _query(self, task_id: str) -> dict:
        with self._lock:
            task = self.tasks.get(task_id)
            if task is None:
                return {"taskId": task_id, "status": "", "errorCode": "807", "errorMessage": "APIKEY_TASK_NOT_FOUND"}
            task["queries"] += 1
            done = task["queries"] > self.polls_before_done
            if task.get("cancelled"):
                return {"taskId": task_id, "status": "CANCEL", "errorCode": "", "errorMessage": "", "results": None}
        if not done:
            return {"taskId": task_id, "status": "RUNNING", "errorCode": "", "errorMessage": "", "results": None}
        if self.fail_code:
            return {
                "taskId": task_id,
                "status": "FAILED",
                "errorCode": self.fail_code,
                "errorMessage": "simulated failure",
                "failedReason": {"node_id": "9", "exception_type": "RuntimeError"},
            }
        return {"taskId": task_id, "status": "SUCCESS", "errorCode": "", "errorMessage": "", "results": self._results(task_id)}

    def _cancel(self, body: dict) -> dict:
        with self._lock:
            self.hits["cancel"] += 1
            task = self.tasks.get(str(body.get("taskId")))
            if not body.get("apiKey"):
                return {"code": 802, "msg": "APIKEY_INVALID", "data": None}
            if task is None:
                return {"code": 807, "msg": "APIKEY_TASK_NOT_FOUND", "data": None}
            task["cancelled"] = True
            self.cancelled.append(str(body["taskId"]))
        return {"code": 0, "msg": "success", "data": None}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _json(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                if not self.headers.get("Authorization", "").startswith("Bearer "):
                    fake.hits["unauthorized"] += 1
                    return self._json(
                        200, {"taskId": "", "status": "", "errorCode": "802", "errorMessage": "APIKEY_UNAUTHORIZED"}
                    )
                if self.path == "/task/openapi/cancel":
                    return self._json(200, fake._cancel(body))
                if self.path == "/openapi/v2/query":
                    fake.hits["query"] += 1
                    return self._json(200, fake._query(str(body.get("taskId"))))
                if self.path.startswith("/openapi/v2/"):
                    fake.hits["submit"] += 1
                    return self._json(200, fake._submit(body))
                self._json(404, {"error": "not found"})

            def do_GET(self):
                if self.path == "/openapi/v2/queue/status":
                    fake.hits["queue_status"] += 1
                    bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
                    if not bearer or (fake.api_key and bearer != fake.api_key):
                        return self._json(200, {"code": 412, "msg": "TOKEN_INVALID", "data": None})
                    running = sum(1 for task_id in fake.tasks if task_id not in fake.cancelled)
                    counts = {"apiKeyType": "enterprise", "concurrentLimit": 1, "runningCount": running, "queuedCount": 0}
                    return self._json(200, {"code": 0, "msg": "success", "data": counts | {"totalCurrentTasks": running}})
                if self.path.startswith("/files/"):
                    fake.hits["download"] += 1
                    n = int(self.path.rsplit("/", 1)[-1].split(".")[0])
                    data, content_type = fake.file or (png((40 * n % 256, 100, 200, 255 if n == 0 else 128)), "image/png")
                    self.send_response(200)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self._json(404, {"error": "not found"})

        return Handler
