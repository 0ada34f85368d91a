"""A local fake of Civitai's Orchestration v2 workflows API, on loopback, for process tests.

Shapes from ../shared/providers/civitai.md:
- `POST /v2/consumer/workflows?wait=N` → 202 with the workflow (`id`, `status`, `tags`,
  `metadata` and `steps` echoed as sent), status `processing`;
- `GET /v2/consumer/workflows/{id}` → `processing` for `polls_before_done` reads, then
  `succeeded` with one `output.images[]` entry whose `url` is this fake's;
- `GET /v2/consumer/workflows?tags=T&take=N` (QueryWorkflows) → `{"items": [...], "next": null}`,
  newest first, the workflows carrying tag T (every workflow without `tags=`);
- `PUT /v2/consumer/workflows/{id}` with `{"status": "canceled"}` (UpdateWorkflow) → the
  workflow, `canceled` from then on;
- `GET /blobs/{id}.png` → a real PNG.
Every workflow it created is kept in `workflows`, so a test counts the tasks per job.
"""

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from tests.fakes.async_provider import png


class FakeCivitai:
    def __init__(self, *, polls_before_done: int = 1):
        self.polls_before_done = polls_before_done
        self.workflows: dict[str, dict] = {}
        self.reads: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def per_job(self) -> dict[str, int]:
        """Workflows created, per job id (from the `metadata` each submit carried)."""
        counts: dict[str, int] = {}
        with self._lock:
            for workflow in self.workflows.values():
                job = str((workflow.get("metadata") or {}).get("jobId"))
                counts[job] = counts.get(job, 0) + 1
        return counts

    def _create(self, body: dict) -> dict:
        with self._lock:
            workflow_id = f"wf_{next(self._ids):06d}"
            self.workflows[workflow_id] = dict(
                id=workflow_id, tags=list(body.get("tags") or []), metadata=body.get("metadata") or {}, steps=body.get("steps")
            )
            self.reads[workflow_id] = 0
        return self._view(workflow_id, done=False)

    def _view(self, workflow_id: str, *, done: bool) -> dict:
        workflow = self.workflows[workflow_id]
        status = "canceled" if workflow.get("canceled") else "succeeded" if done else "processing"
        image = {"id": f"{workflow_id}.png", "url": f"{self.url}/blobs/{workflow_id}.png", "available": True}
        step = {"name": "$0", "$type": "imageGen", "status": status, "jobs": [{"id": "j1", "status": status}]}
        step["output"] = {"images": [image], "errors": []} if status == "succeeded" else None
        public = {key: value for key, value in workflow.items() if key != "canceled"}
        return dict(public, status=status, cost={}, transactions=[], steps=[step])

    def _read(self, workflow_id: str) -> dict | None:
        with self._lock:
            if workflow_id not in self.workflows:
                return None
            self.reads[workflow_id] += 1
            done = self.reads[workflow_id] > self.polls_before_done
        return self._view(workflow_id, done=done)

    def _query(self, tag: str | None) -> dict:
        with self._lock:
            ids = [key for key, value in self.workflows.items() if tag is None or tag in value["tags"]]
            done = {key: self.reads[key] > self.polls_before_done for key in ids}
        return {"items": [self._view(key, done=done[key]) for key in reversed(ids)], "next": None}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload=None, *, raw: bytes | None = None, kind="application/json"):
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization", "").startswith("Bearer "):
                    return True
                self._send(401, {"title": "Unauthorized", "status": 401})
                return False

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self._authorized():
                    return
                if urlsplit(self.path).path == "/v2/consumer/workflows":
                    return self._send(202, fake._create(body))
                self._send(404, {"title": "Not Found", "status": 404})

            def do_PUT(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self._authorized():
                    return
                workflow_id = urlsplit(self.path).path.rsplit("/", 1)[1]
                with fake._lock:
                    workflow = fake.workflows.get(workflow_id)
                    if workflow is not None and body.get("status") == "canceled":
                        workflow["canceled"] = True
                if workflow is None:
                    return self._send(404, {"title": "Not Found", "status": 404})
                self._send(200, fake._view(workflow_id, done=False))

            def do_GET(self):
                parts = urlsplit(self.path)
                if parts.path.startswith("/blobs/"):
                    return self._send(200, raw=png(), kind="image/png")
                if not self._authorized():
                    return
                if parts.path == "/v2/consumer/workflows":
                    return self._send(200, fake._query((parse_qs(parts.query).get("tags") or [None])[0]))
                if parts.path.startswith("/v2/consumer/workflows/"):
                    workflow = fake._read(parts.path.rsplit("/", 1)[1])
                    if workflow is None:
                        return self._send(404, {"title": "Not Found", "status": 404})
                    return self._send(200, workflow)
                self._send(404, {"title": "Not Found", "status": 404})

        return Handler
