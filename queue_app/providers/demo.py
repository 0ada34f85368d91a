"""The demo provider: offline, no key, real outputs.

Options on the provider record:
- `mode`: `sync` (finishes in the call) or `async` (returns a task id to poll);
- `latency_ms`: how long a generation takes;
- `fail_rate` (0–1): share of calls that fail, with `fail_kind` one of `transient` (default),
  `permanent`, `ambiguous`, `account` (no credit) or `rate_limit` (a 429 with `retry_after` seconds, default 2);
- `layers`: how many transparent layers the `demo-layers` model returns (default 3).

It keeps a ledger of its own calls per provider record (one append-only file each, readable
by any process), so tests and benchmarks measure the concurrency the provider really saw.
"""

import hashlib
import io
import math
import os
import random
import struct
import textwrap
import time
import uuid
import wave
from pathlib import Path

from PIL import Image, ImageDraw

from queue_app import limits
from queue_app.providers.base import (
    AccountError,
    AmbiguousError,
    Failed,
    Finished,
    Output,
    PermanentError,
    ResolvedJob,
    Running,
    Submitted,
    TransientError,
)
from queue_app.providers.catalogue import parse_shape

POLL_SECONDS = 1.0
# Local and free: no limit worth keeping to (the highest budget a record may set).
STATUS_PER_MINUTE = 60_000


# --- The ledger ---------------------------------------------------------------------


def ledger_dir() -> Path:
    from django.conf import settings

    path = Path(settings.DEMO_LEDGER_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _ledger_write(provider_id: int, line: str) -> None:
    # One small O_APPEND write is atomic on a local file, so processes need no lock.
    fd = os.open(ledger_dir() / f"{provider_id}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def calls(provider_id: int) -> list[tuple[float, float | None]]:
    """Every call the provider saw: (start, end) in epoch seconds; end None while in flight."""
    path = ledger_dir() / f"{provider_id}.log"
    if not path.exists():
        return []
    starts, ends = {}, {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        mark, call_id, stamp = parts
        (starts if mark == "S" else ends)[call_id] = float(stamp)
    return [(start, ends.get(call_id)) for call_id, start in starts.items()]


def peak_inflight(provider_id: int) -> int:
    """The most calls in flight at once, over the whole ledger (exact, not sampled)."""
    events = []
    for start, end in calls(provider_id):
        events.append((start, 1))
        events.append((end if end is not None else math.inf, -1))
    # At equal times an end sorts before a start: back-to-back calls do not overlap.
    events.sort(key=lambda event: (event[0], event[1]))
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def reset_ledger(provider_id: int) -> None:
    (ledger_dir() / f"{provider_id}.log").unlink(missing_ok=True)


# --- Outputs ------------------------------------------------------------------------


def _colour(seed: str) -> tuple[int, int, int]:
    digest = hashlib.sha256(seed.encode()).digest()
    return digest[0], digest[1], digest[2]


def _size(aspect_ratio: str, long_edge: int = 256) -> tuple[int, int]:
    ratio = parse_shape(aspect_ratio) or 1.0
    if ratio >= 1:
        return long_edge, max(16, round(long_edge / ratio))
    return max(16, round(long_edge * ratio)), long_edge


def render_png(prompt: str, aspect_ratio: str = "1:1", *, label: str = "", transparent: bool = False) -> bytes:
    width, height = _size(aspect_ratio)
    if transparent:
        image = Image.new("RGBA", (width, height), (0, 0, 0, 0))
        draw = ImageDraw.Draw(image)
        inset = width // 6
        draw.ellipse((inset, inset, width - inset, height - inset), fill=(*_colour(prompt + label), 200))
    else:
        image = Image.new("RGB", (width, height), _colour(prompt))
        draw = ImageDraw.Draw(image)
    text = "\n".join(textwrap.wrap((label + " " if label else "") + prompt, width=max(10, width // 8))[:8])
    draw.multiline_text((8, 8), text, fill=(255, 255, 255))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def render_wav(prompt: str, seconds: float = 0.5, rate: int = 8000) -> bytes:
    frequency = 220 + int(hashlib.sha256(prompt.encode()).hexdigest()[:4], 16) % 660
    frames = b"".join(
        struct.pack("<h", int(12000 * math.sin(2 * math.pi * frequency * n / rate))) for n in range(int(seconds * rate))
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(frames)
    return buffer.getvalue()


def outputs_for(job: ResolvedJob) -> list[Output]:
    if job.kind == "text":
        return [Output(kind="text", text=f"Demo answer to a {len(job.prompt)}-character prompt.", content_type="text/plain")]
    if job.kind == "audio":
        return [Output(kind="audio", data=render_wav(job.prompt), content_type="audio/wav")]
    if job.model == "demo-layers":
        # Clamped as well as validated: a row written before the limit existed still
        # renders at most the declared number of layers.
        layers = max(1, min(limits.DEMO_LAYERS.high, int(job.params.get("layers", job.options.get("layers", 3)))))
        outputs = [
            Output(kind="image", data=render_png(job.prompt, job.aspect_ratio), content_type="image/png", role="composite")
        ]
        for n in range(1, layers + 1):
            png = render_png(job.prompt, job.aspect_ratio, label=f"layer {n}", transparent=True)
            outputs.append(Output(kind="image", data=png, content_type="image/png", role="layer"))
        return outputs
    width, height = _size(job.aspect_ratio)
    png = render_png(job.prompt, job.aspect_ratio)
    return [Output(kind="image", data=png, content_type="image/png", width=width, height=height)]


# --- The adapter ----------------------------------------------------------------------


def _maybe_fail(options: dict) -> None:
    if random.random() >= float(options.get("fail_rate", 0) or 0):
        return
    kind = options.get("fail_kind", "transient")
    if kind == "permanent":
        raise PermanentError("demo provider refused the prompt (simulated permanent failure)")
    if kind == "account":
        raise AccountError("demo provider: the account has no credit left (simulated)")
    if kind == "ambiguous":
        raise AmbiguousError("demo provider timed out after the request was sent (simulated)")
    if kind == "rate_limit":
        raise TransientError("demo provider answered 429 (simulated)", delay=float(options.get("retry_after", 2)))
    raise TransientError("demo provider answered 503 (simulated transient failure)")


def submit(job: ResolvedJob) -> Finished | Submitted:
    options = job.options
    latency = float(options.get("latency_ms", 200)) / 1000
    call_id = uuid.uuid4().hex
    start = time.time()
    if options.get("mode", "sync") == "async":
        _maybe_fail(options)
        deadline = start + latency
        _ledger_write(job.provider_id, f"S {call_id} {start:.6f}")
        _ledger_write(job.provider_id, f"E {call_id} {deadline:.6f}")
        return Submitted(task_id=f"demo:{call_id}:{int(deadline * 1000)}")
    _ledger_write(job.provider_id, f"S {call_id} {start:.6f}")
    try:
        time.sleep(latency)
        _maybe_fail(options)
        return Finished(outputs=outputs_for(job))
    finally:
        _ledger_write(job.provider_id, f"E {call_id} {time.time():.6f}")


def check(task_id: str, job: ResolvedJob) -> Running | Finished | Failed:
    try:
        _, _call_id, deadline_ms = task_id.split(":")
        deadline = int(deadline_ms) / 1000
    except ValueError:
        return Failed(reason=f"unknown demo task {task_id[:40]!r}", permanent=True)
    now = time.time()
    if now < deadline:
        latency = max(0.001, float(job.options.get("latency_ms", 200)) / 1000)
        return Running(progress=max(0.0, min(1.0, 1 - (deadline - now) / latency)))
    return Finished(outputs=outputs_for(job))
