"""Step progress of a running prompt, from the instance's WebSocket, onto the job.

ComfyUI sends `progress {value, max, prompt_id, node}` from nodes with a progress bar
(a sampler's steps; it never reports max/max) and `executing {node, prompt_id}` when a node
starts (12_binary_preview_frames). `Throttle` (no I/O, runs on the listener's event loop)
lets through at most one write per prompt per second, and the last value seen when the
prompt ends, so a reload shows the bar without a database write per step. `persist` (a
worker thread) writes `Job.progress` and the node, and broadcasts on the project socket.
The bar is value/max of the node running now, labelled with that node.
"""

import time

from queue_app.engine import events
from queue_app.models import Job, Kind, Status

WRITE_INTERVAL = 1.0


def parse(message: dict) -> tuple[str, str, float | None] | None:
    """(prompt_id, node, fraction or None) of a progress or executing message; None otherwise."""
    kind, data = message.get("type"), message.get("data") or {}
    prompt_id = data.get("prompt_id")
    if not prompt_id or not isinstance(data, dict):
        return None
    if kind == "progress":
        value, top = data.get("value"), data.get("max")
        if not isinstance(value, int | float) or not isinstance(top, int | float) or top <= 0:
            return None
        return str(prompt_id), str(data.get("node") or ""), max(0.0, min(1.0, value / top))
    if kind == "executing" and data.get("node") is not None:
        return str(prompt_id), str(data["node"]), None
    return None


class Throttle:
    """Which progress updates to write: per prompt, at most one per `interval` seconds,
    and always the last one seen once the prompt ends (`final`)."""

    def __init__(self, interval: float = WRITE_INTERVAL, clock=time.monotonic):
        self.interval, self.clock = interval, clock
        self._written: dict[str, float] = {}
        self._latest: dict[str, tuple[str, float]] = {}
        self._dirty: set[str] = set()

    def offer(self, prompt_id: str, node: str, fraction: float | None) -> tuple[str, float] | None:
        """(node, fraction) to write now, or None to wait."""
        if fraction is None:  # a node started: its bar starts at 0
            fraction = 0.0
        self._latest[prompt_id] = (node, fraction)
        now = self.clock()
        if now - self._written.get(prompt_id, -1e9) >= self.interval:
            self._written[prompt_id] = now
            self._dirty.discard(prompt_id)
            return node, fraction
        self._dirty.add(prompt_id)
        return None

    def final(self, prompt_id: str) -> tuple[str, float] | None:
        """The prompt ended: its last unwritten update, if any; its state is dropped."""
        latest = self._latest.pop(prompt_id, None)
        self._written.pop(prompt_id, None)
        if prompt_id in self._dirty:
            self._dirty.discard(prompt_id)
            return latest
        return None


def persist(prompt_id: str, node: str, fraction: float) -> bool:
    """Write the progress of the processing ComfyUI job running `prompt_id`, and tell the
    project's open pages. False when no such job (finished, or not ours)."""
    from comfy_app.models import ComfyRun

    row = (
        Job.objects.filter(task_id=prompt_id, status=Status.PROCESSING, project__kind=Kind.COMFYUI)
        .values_list("id", "project_id")
        .first()
    )
    if row is None:
        return False
    job_id, project_id = row
    Job.objects.filter(id=job_id, status=Status.PROCESSING).update(progress=fraction)
    run = ComfyRun.objects.filter(job_id=job_id).values_list("graph", flat=True).first() or {}
    label = node_label(run, node)
    ComfyRun.objects.filter(job_id=job_id).update(progress_node=label)
    events.broadcast_progress(project_id, job_id, fraction, detail=label)
    return True


def node_label(graph: dict, node: str) -> str:
    """The node id with its class ("node 3 (KSampler)"), as ComfyUI's own UI names it."""
    if not node:
        return ""
    class_type = ((graph or {}).get(node) or {}).get("class_type") if isinstance(graph, dict) else None
    return f"node {node} ({class_type})" if class_type else f"node {node}"
