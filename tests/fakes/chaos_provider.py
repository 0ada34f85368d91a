"""A local HTTP fake of two real provider families, with faults, for the chaos suite.

It speaks Replicate's predictions API (async: create, poll, list, cancel, output files)
and OpenAI's image generations (sync), in the shapes recorded in ../shared/providers/,
so the real adapters are what a chaos run exercises. Each provider record is told apart
by its API key (`Authorization: Bearer <key>`); every request is written to an in-memory
ledger with monotonic-free wall-clock timestamps (one process, one clock), so a run can
compute exactly:

- concurrency per provider record: the most generations in flight at once, from exact
  intervals (sync: request start → response sent or client gone; async: create start →
  the task's end at the fake, cut at the last poll for a task that never finishes;
  tasks never polled are orphans, counted on their own);
- Retry-After compliance: a create of the same record that started inside a 429's
  announced window;
- remote submissions per job: accepted creates grouped by the job token in the prompt
  (`chaos-job-<n>`).

Faults are drawn from a seeded RNG per record: 5xx, 429 with Retry-After, connection
reset before the body is read (nothing created) or after the work was accepted, slow
bodies, malformed JSON, a hang past the client's timeout, async tasks that fail or
never finish. Used by bench/chaos.py; a test can use it directly too.
"""

import base64
import io
import json
import math
import random
import re
import select
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

JOB_TOKEN = re.compile(r"chaos-job-(\d+)")

CREATE_FAULTS = ("5xx", "429", "reset_before", "reset_after", "slow_body", "malformed", "hang")
POLL_FAULTS = ("5xx", "reset_before", "slow_body", "malformed")


def tiny_png(seed: str) -> bytes:
    from PIL import Image

    digest = uuid.uuid5(uuid.NAMESPACE_OID, seed).bytes
    image = Image.new("RGB", (16, 16), (digest[0], digest[1], digest[2]))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class Record:
    """How one provider record (one API key) behaves."""

    family: str  # "replicate" (async) | "openai" (sync)
    latency: tuple = (0.2, 0.6)  # seconds of work per generation
    create_faults: dict = field(default_factory=dict)  # fault name -> probability
    poll_faults: dict = field(default_factory=dict)
    task_fail_rate: float = 0.0  # async: the task ends `failed` (generic error)
    task_never_rate: float = 0.0  # async: the task stays `processing` forever
    retry_after: float = 2.0
    hang_seconds: float = 20.0  # longer than the adapter's read timeout in chaos runs
    slow_seconds: float = 1.5
    poll_delay: float = 0.0  # seconds every status check takes
    rng: random.Random = field(default_factory=random.Random)


@dataclass
class Prediction:
    id: str
    key: str
    job: str
    created: float
    work_end: float  # inf: never finishes
    failed: bool
    input: dict
    model: str
    first_delivered: bool = False  # the 201 reached the client
    delivered_terminal: bool = False  # ... already finished (`Prefer: wait`)
    polls: list = field(default_factory=list)
    # When a list page showed it: not a poll, since an orphan (an id the client never
    # stored) shows on the list too; a listed task that finished gets a single check.
    listed: list = field(default_factory=list)
    canceled: bool = False


class ChaosProvider:
    def __init__(self, *, seed: int = 0):
        self.seed = seed
        self.records: dict[str, Record] = {}
        self.predictions: dict[str, Prediction] = {}
        self.ledger: list[dict] = []
        self.lock = threading.Lock()
        self.server = None
        self.thread = None

    # --- setup --------------------------------------------------------------------

    def configure(self, key: str, **options) -> Record:
        record = Record(**options)
        record.rng = random.Random(f"{self.seed}:{key}")
        self.records[key] = record
        return record

    def start(self) -> "ChaosProvider":
        fake = self

        class Handler(_Handler):
            provider = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 128
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="chaos-provider", daemon=True
        )
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- ledger -------------------------------------------------------------------

    def record(self, **entry) -> dict:
        with self.lock:
            self.ledger.append(entry)
        return entry

    def entries(self, key: str | None = None, kind: str | None = None) -> list[dict]:
        with self.lock:
            rows = list(self.ledger)
        return [row for row in rows if (key is None or row["key"] == key) and (kind is None or row["kind"] == kind)]

    # --- figures ------------------------------------------------------------------

    def intervals(self, key: str) -> list[tuple[float, float]]:
        """Exact in-flight intervals of the generations this record ran (orphans excluded)."""
        return [(span["start"], span["end"]) for span in self.spans(key)]

    def spans(self, key: str) -> list[dict]:
        """The in-flight intervals with what they were: job token, create outcome, task id."""
        record = self.records[key]
        spans = []
        if record.family == "openai":
            for row in self.entries(key, "create"):
                if row.get("worked"):
                    # An answer delivered ends the call when its last byte left: the client
                    # cannot act on it sooner, and the fake's own thread may be scheduled
                    # later than that to write `end`.
                    end = row.get("sent") or row["end"]
                    spans.append(dict(start=row["start"], end=end, job=row["job"], outcome=row["outcome"], task=""))
        else:
            with self.lock:
                predictions = [p for p in self.predictions.values() if p.key == key]
            for p in predictions:
                if p.delivered_terminal:
                    end = p.work_end
                elif p.polls:
                    end = min(p.work_end, max(p.polls))
                else:
                    continue  # never polled — the client never got or never stored the id (orphan)
                spans.append(dict(start=p.created, end=end, job=p.job, outcome="failed" if p.failed else "task", task=p.id))
        return spans

    def peak_inflight(self, key: str) -> int:
        return max((len(spans) for spans in self.crowds(key)), default=0)

    def crowds(self, key: str, above: int = 0) -> list[list[dict]]:
        """At each call's start that left more than `above` calls in flight: the calls in
        flight then (for a violation: which calls overlapped)."""
        events = []
        for span in self.spans(key):
            events.append((span["start"], 1, id(span), span))
            events.append((span["end"], -1, id(span), span))
        events.sort(key=lambda event: (event[0], event[1]))
        current: dict[int, dict] = {}
        crowds = []
        for _, delta, ident, span in events:
            if delta > 0:
                current[ident] = span
                if len(current) > above:
                    crowds.append(list(current.values()))
            else:
                current.pop(ident, None)
        return crowds

    def closest_handover(self, key: str, limit: int) -> float | None:
        """The smallest margin by which the limit held: over the calls that started with
        `limit - 1` others in flight, the least time since the latest call had ended
        (None when the limit was never reached)."""
        spans = self.spans(key)
        ends = sorted(span["end"] for span in spans)
        closest = None
        for span in spans:
            others = sum(1 for other in spans if other is not span and other["start"] <= span["start"] < other["end"])
            before = [end for end in ends if end <= span["start"]]
            if others == limit - 1 and before:
                gap = span["start"] - before[-1]
                closest = gap if closest is None else min(closest, gap)
        return closest

    def orphans(self, key: str) -> int:
        """Remote tasks created but never polled (the client never stored or never got the id)."""
        with self.lock:
            return sum(1 for p in self.predictions.values() if p.key == key and not p.polls and not p.delivered_terminal)

    def retry_after_violations(self, key: str, tolerance: float = 0.05, grace: float = 0.25, known=None) -> list[dict]:
        """Creates of this record that started inside a 429's announced window, more than
        `grace` seconds after the client knew of the 429. `known(row)` says when that was
        for a 429 row (the client's own record of it), or None when it never learned of it
        (its worker died first); by default, when it was sent. A
        create another worker had already sent on its way before then cannot be recalled;
        those are counted by `creates_in_flight_at_429`, not here."""
        known = known or (lambda row: row["end"])
        creates = self.entries(key, "create")
        windows = [(known(row), row["end"] + row["retry_after"]) for row in creates if row["outcome"] == "429"]
        windows = [(seen, stop) for seen, stop in windows if seen is not None]  # None: the client never learned of it
        return [row for row in creates if any(seen + grace < row["start"] < stop - tolerance for seen, stop in windows)]

    def creates_in_flight_at_429(self, key: str, grace: float = 0.25, known=None) -> list[dict]:
        """Creates that started after a 429 was sent, but before `grace` seconds after the
        client knew of it."""
        known = known or (lambda row: row["end"])
        creates = self.entries(key, "create")
        windows = [(row["end"], known(row)) for row in creates if row["outcome"] == "429"]
        windows = [(sent, seen) for sent, seen in windows if seen is not None]
        return [row for row in creates if any(sent < row["start"] <= seen + grace for sent, seen in windows)]

    def submissions_per_job(self, key: str | None = None) -> dict[str, int]:
        """Creates the provider accepted (work was done or a task created), per job token."""
        counts: dict[str, int] = {}
        for row in self.entries(key, "create"):
            if row.get("worked") and row.get("job"):
                counts[row["job"]] = counts.get(row["job"], 0) + 1
        return counts

    def resubmission_causes(self) -> dict[str, int]:
        """Per job token, what the fake saw that entitles the client to submit again: an
        accepted create whose answer did not arrive intact (ambiguous to the client), and
        a task that failed remotely — whether a poll found it or the create's own answer
        (`Prefer: wait`) already carried the failure."""
        causes: dict[str, int] = {}
        for row in self.entries(kind="create"):
            if row.get("worked") and row.get("job") and row["outcome"] not in ("ok", "slow_body"):
                causes[row["job"]] = causes.get(row["job"], 0) + 1
        with self.lock:
            failed = [p.job for p in self.predictions.values() if p.failed and (p.polls or p.delivered_terminal)]
        for job in failed:
            causes[job] = causes.get(job, 0) + 1
        return causes

    def failed_tasks_per_job(self) -> dict[str, int]:
        """Per job token, its tasks that failed remotely and were seen failing (a poll, or
        the create's own answer): each entitles the job to one fresh submission."""
        counts: dict[str, int] = {}
        with self.lock:
            for p in self.predictions.values():
                if p.failed and p.job and (p.polls or p.delivered_terminal):
                    counts[p.job] = counts.get(p.job, 0) + 1
        return counts

    def create_outcomes(self, key: str | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.entries(key, "create"):
            counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
        return counts


def _draw(rng: random.Random, faults: dict) -> str | None:
    roll = rng.random()
    total = 0.0
    for name, probability in faults.items():
        total += probability
        if roll < total:
            return name
    return None


class _Handler(BaseHTTPRequestHandler):
    provider: ChaosProvider
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: the ledger is the record
        pass

    # --- plumbing -----------------------------------------------------------------

    def _key(self) -> str:
        auth = self.headers.get("Authorization", "")
        for prefix in ("Bearer ", "Token "):
            if auth.startswith(prefix):
                return auth[len(prefix) :].strip()
        return ""

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reset(self) -> None:
        """Close with RST: the client sees a connection reset."""
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True
        try:
            self.connection.close()
        except OSError:
            pass

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
        return False

    def _work(self, seconds: float) -> bool:
        """Sleep while watching the socket; False when the client went away."""
        deadline = time.time() + seconds
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                return True
            if self._client_gone():
                return False
            time.sleep(min(0.02, remaining))

    def _send(self, status: int, payload, *, headers: dict | None = None, slow: float = 0.0, raw: bytes | None = None) -> bool:
        body = raw if raw is not None else json.dumps(payload).encode()
        self.sent_at = None  # when the last byte went out; None when it never did
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if slow > 0:
                # A pause between pieces, none after the last: once the body is out the
                # client may act on it, so the call ends there (a trailing pause kept the
                # books counting a finished call as in flight for 0.3 s).
                pieces = 5
                step = max(1, math.ceil(len(body) / pieces))
                for offset in range(0, len(body), step):
                    if offset:
                        time.sleep(slow / (pieces - 1))
                    if offset + step >= len(body):
                        self.sent_at = time.time()
                    self.wfile.write(body[offset : offset + step])
                    self.wfile.flush()
            else:
                self.sent_at = time.time()
                self.wfile.write(body)
            self.wfile.flush()
            return True
        except OSError:
            self.close_connection = True
            return False

    def _error(self, family: str, status: int, message: str, *, headers=None) -> None:
        if family == "openai":
            kind = "rate_limit_exceeded" if status == 429 else "server_error"
            payload = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        else:
            payload = {"title": message, "detail": message, "status": status}
        self._send(status, payload, headers=headers)

    # --- routing ------------------------------------------------------------------

    def do_POST(self):
        path = self.path.split("?")[0]
        if path == "/v1/images/generations":
            return self._openai_generate()
        if path == "/v1/predictions" or re.fullmatch(r"/v1/models/[^/]+/[^/]+/predictions", path):
            return self._replicate_create(path)
        match = re.fullmatch(r"/v1/predictions/([\w-]+)/cancel", path)
        if match:
            self._body()
            return self._replicate_cancel(match.group(1))
        self._body()
        self._send(404, {"detail": "not found", "status": 404})

    def do_GET(self):
        path = self.path.split("?")[0]
        match = re.fullmatch(r"/v1/predictions/([\w-]+)", path)
        if match:
            return self._replicate_get(match.group(1))
        if path == "/v1/predictions":
            return self._replicate_list()
        match = re.fullmatch(r"/files/([\w-]+)\.png", path)
        if match:
            return self._file(match.group(1))
        self._send(404, {"detail": "not found", "status": 404})

    # --- faults shared by creates ---------------------------------------------------

    def _create_fault(self, record: Record, key: str, entry: dict) -> str | None:
        """Apply a drawn create fault that happens before any work. Returns the fault
        name when the request is finished here, else the fault to apply later."""
        fault = _draw(record.rng, record.create_faults)
        if fault == "reset_before":
            entry.update(outcome="reset_before", end=time.time())
            self.provider.record(**entry)
            self._reset()
            return "done"
        if fault == "5xx":
            self._error(record.family, 503, "The server is overloaded (chaos)")
            entry.update(outcome="5xx", end=time.time())
            self.provider.record(**entry)
            return "done"
        if fault == "429":
            delay = record.retry_after
            headers = {"Retry-After": str(int(math.ceil(delay)))}
            entry.update(outcome="429", retry_after=float(int(math.ceil(delay))))
            self._error(record.family, 429, "Request was throttled (chaos)", headers=headers)
            entry["end"] = time.time()
            self.provider.record(**entry)
            return "done"
        if fault == "hang":
            # Accepts nothing, answers nothing until the client gives up.
            self._work(record.hang_seconds)
            entry.update(outcome="hang", end=time.time())
            self.provider.record(**entry)
            self._reset()
            return "done"
        return fault

    # --- OpenAI images (sync) -------------------------------------------------------

    def _openai_generate(self):
        start = time.time()
        key = self._key()
        record = self.provider.records.get(key)
        if record is None or record.family != "openai":
            self._body()
            return self._error("openai", 401, "Incorrect API key provided")
        entry = dict(kind="create", key=key, start=start, job="", outcome="", worked=False, retry_after=0.0)
        raw = self._body()
        token = JOB_TOKEN.search(raw.decode(errors="replace"))
        entry["job"] = token.group(1) if token else ""
        fault = self._create_fault(record, key, entry)
        if fault == "done":
            return
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            request = {}
        seconds = record.rng.uniform(*record.latency)
        finished = self._work(seconds)
        entry.update(worked=True)
        if not finished:
            entry.update(outcome="client_gone", end=time.time())
            self.provider.record(**entry)
            return
        if fault == "reset_after":
            entry.update(outcome="reset_after", end=time.time())
            self.provider.record(**entry)
            return self._reset()
        if fault == "malformed":
            self._send(200, None, raw=b'{"created": 1, "data": [{"b64_json": "iVBOR')
            entry.update(outcome="malformed", end=time.time(), sent=self.sent_at)
            self.provider.record(**entry)
            return
        n = max(1, min(int(request.get("n") or 1), 4))
        png = base64.b64encode(tiny_png(f"{key}:{entry['job']}")).decode()
        payload = {
            "created": int(start),
            "data": [{"b64_json": png, "revised_prompt": None} for _ in range(n)],
            "background": "opaque",
            "output_format": "png",
            "quality": request.get("quality") or "low",
            "size": request.get("size") or "1024x1024",
            "usage": {"input_tokens": 10, "output_tokens": 100, "total_tokens": 110},
        }
        sent = self._send(200, payload, slow=record.slow_seconds if fault == "slow_body" else 0.0)
        entry.update(outcome=("slow_body" if fault == "slow_body" else "ok") if sent else "client_gone", end=time.time())
        if sent:
            entry["sent"] = self.sent_at
        self.provider.record(**entry)

    # --- Replicate predictions (async) ---------------------------------------------

    def _prediction_json(self, p: Prediction, now: float) -> dict:
        if p.canceled:
            status, output, error = "canceled", None, None
        elif now < p.work_end:
            status = "starting" if now - p.created < 0.05 else "processing"
            output, error = None, None
        elif p.failed:
            status, output, error = "failed", None, "CUDA error: an illegal memory access was encountered (chaos)"
        else:
            status, output, error = "succeeded", [f"{self.provider.url}/files/{p.id}.png"], None
        base = self.provider.url
        return {
            "id": p.id,
            "model": p.model,
            "version": "chaos",
            "input": p.input,
            "logs": "",
            "output": output,
            "error": error,
            "status": status,
            "data_removed": False,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(p.created)),
            "urls": {
                "get": f"{base}/v1/predictions/{p.id}",
                "cancel": f"{base}/v1/predictions/{p.id}/cancel",
                "web": f"{base}/p/{p.id}",
            },
        }

    def _replicate_create(self, path: str):
        start = time.time()
        key = self._key()
        record = self.provider.records.get(key)
        if record is None or record.family != "replicate":
            self._body()
            return self._send(401, {"title": "Unauthenticated", "detail": "Invalid token.", "status": 401})
        entry = dict(kind="create", key=key, start=start, job="", outcome="", worked=False, retry_after=0.0)
        raw = self._body()
        token = JOB_TOKEN.search(raw.decode(errors="replace"))
        entry["job"] = token.group(1) if token else ""
        fault = self._create_fault(record, key, entry)
        if fault == "done":
            return
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            entry.update(outcome="bad_json", end=time.time())
            self.provider.record(**entry)
            return self._send(400, {"title": "Invalid JSON", "detail": "body is not JSON", "status": 400})
        model = request.get("version") or path.removeprefix("/v1/models/").removesuffix("/predictions")
        roll = record.rng.random()
        never = roll < record.task_never_rate
        failed = not never and roll < record.task_never_rate + record.task_fail_rate
        seconds = record.rng.uniform(*record.latency)
        prediction = Prediction(
            id=uuid.uuid4().hex[:26],
            key=key,
            job=entry["job"],
            created=start,
            work_end=math.inf if never else start + seconds,
            failed=failed,
            input=request.get("input") or {},
            model=str(model),
        )
        with self.provider.lock:
            self.provider.predictions[prediction.id] = prediction
        entry.update(worked=True, prediction=prediction.id)
        prefer = self.headers.get("Prefer", "")
        if prefer.startswith("wait"):
            wait = float(prefer.partition("=")[2] or 60)
            self._work(min(wait, max(0.0, prediction.work_end - time.time())))
        if fault == "reset_after":
            entry.update(outcome="reset_after", end=time.time())
            self.provider.record(**entry)
            return self._reset()
        if fault == "malformed":
            self._send(201, None, raw=b'{"id": "' + prediction.id.encode() + b'", "status": "star')
            entry.update(outcome="malformed", end=time.time())
            self.provider.record(**entry)
            return
        payload = self._prediction_json(prediction, time.time())
        sent = self._send(
            201,
            payload,
            headers={"ratelimit-remaining": "599", "ratelimit-reset": "1"},
            slow=record.slow_seconds if fault == "slow_body" else 0.0,
        )
        prediction.first_delivered = sent
        prediction.delivered_terminal = sent and payload["status"] in ("succeeded", "failed", "canceled")
        entry.update(outcome=("slow_body" if fault == "slow_body" else "ok") if sent else "client_gone", end=time.time())
        self.provider.record(**entry)

    def _replicate_get(self, prediction_id: str):
        start = time.time()
        key = self._key()
        record = self.provider.records.get(key)
        with self.provider.lock:
            prediction = self.provider.predictions.get(prediction_id)
        if record is None:
            return self._send(401, {"title": "Unauthenticated", "detail": "Invalid token.", "status": 401})
        if prediction is None or prediction.key != key:
            return self._send(404, {"title": "Not found", "detail": "Prediction not found", "status": 404})
        if record.poll_delay:
            time.sleep(record.poll_delay)
        prediction.polls.append(start)
        entry = dict(kind="poll", key=key, start=start, job=prediction.job, prediction=prediction_id, outcome="ok")
        fault = _draw(record.rng, record.poll_faults)
        if fault == "reset_before":
            entry.update(outcome=fault, end=time.time())
            self.provider.record(**entry)
            return self._reset()
        if fault == "5xx":
            self._send(503, {"title": "Service Unavailable", "detail": "try again (chaos)", "status": 503})
        elif fault == "malformed":
            self._send(200, None, raw=b'{"id": "' + prediction_id.encode() + b'", "status": ')
        else:
            self._send(
                200,
                self._prediction_json(prediction, time.time()),
                slow=record.slow_seconds if fault == "slow_body" else 0.0,
            )
        entry.update(outcome=fault or "ok", end=time.time())
        self.provider.record(**entry)

    def _replicate_list(self):
        # Newest first, 100 a page, `next` carrying a cursor (Replicate's shape).
        start = time.time()
        key = self._key()
        record = self.provider.records.get(key)
        if record is None:
            return self._send(401, {"title": "Unauthenticated", "detail": "Invalid token.", "status": 401})
        query = parse_qs(urlsplit(self.path).query)
        offset = int((query.get("cursor") or ["0"])[0] or 0)
        if record.poll_delay:
            time.sleep(record.poll_delay)
        with self.provider.lock:
            mine = [p for p in self.provider.predictions.values() if p.key == key]
        mine.sort(key=lambda p: p.created, reverse=True)
        page = mine[offset : offset + 100]
        fault = _draw(record.rng, record.poll_faults)  # a list is a status read: the same faults
        entry = dict(kind="list", key=key, start=start, job="", outcome=fault or "ok", listed=0)
        if fault == "reset_before":
            entry.update(end=time.time())
            self.provider.record(**entry)
            return self._reset()
        if fault == "5xx":
            self._send(503, {"title": "Service Unavailable", "detail": "try again (chaos)", "status": 503})
        elif fault == "malformed":
            self._send(200, None, raw=b'{"next": null, "results": [')
        else:
            for p in page:
                p.listed.append(start)
            following = f"{self.provider.url}/v1/predictions?cursor={offset + 100}" if offset + 100 < len(mine) else None
            body = {"previous": None, "next": following, "results": [self._prediction_json(p, start) for p in page]}
            self._send(200, body, slow=record.slow_seconds if fault == "slow_body" else 0.0)
            entry.update(listed=len(page))
        entry.update(end=time.time())
        self.provider.record(**entry)

    def _replicate_cancel(self, prediction_id: str):
        key = self._key()
        with self.provider.lock:
            prediction = self.provider.predictions.get(prediction_id)
        if prediction is None or prediction.key != key:
            return self._send(404, {"title": "Not found", "detail": "Prediction not found", "status": 404})
        prediction.canceled = True
        prediction.polls.append(time.time())
        self._send(200, self._prediction_json(prediction, time.time()))

    def _file(self, prediction_id: str):
        with self.provider.lock:
            prediction = self.provider.predictions.get(prediction_id)
        if prediction is None:
            return self._send(404, {"detail": "gone"})
        self.provider.record(kind="download", key=prediction.key, start=time.time(), end=time.time(), job=prediction.job)
        data = tiny_png(f"{prediction.key}:{prediction.job}")
        try:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True
