"""Turning a project's API-format workflow and a job's draft fields into a prompt graph.

- bound inputs get the job's values: text (coerced to the type of the value it replaces),
  numbers, seeds, and references (images, video, audio) uploaded under a content-hash
  name, so a file the instance already holds is not uploaded again;
- every integer seed input the project leaves unbound is re-rolled per job and recorded
  on the job (`params["seeds"]`), so the job can be reproduced; a retry reuses it.
"""

import base64
import copy
import hashlib
import mimetypes
import random

from queue_app.providers import net

SEED_INPUTS = ("seed", "noise_seed")
SEED_MAX = 2**53 - 1  # exact in JSON and in JavaScript
KINDS = ("text", "number", "seed", "image", "video", "audio")
MEDIA_KINDS = ("image", "video", "audio")


class WorkflowError(ValueError):
    """The project's workflow or bindings cannot make a prompt: permanent."""


def validate_workflow(workflow) -> dict:
    if isinstance(workflow, dict) and "nodes" in workflow and "links" in workflow:
        raise WorkflowError("this is a UI workflow; export it with “Save (API Format)” in ComfyUI")
    if not isinstance(workflow, dict) or not workflow:
        raise WorkflowError("the workflow must be a non-empty API-format object {node_id: {class_type, inputs}}")
    for node_id, node in workflow.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str) or not isinstance(node.get("inputs"), dict):
            raise WorkflowError(f"node {node_id!r} needs a class_type and an inputs object")
    return workflow


def validate_bindings(bindings, workflow: dict) -> list:
    if not isinstance(bindings, list):
        raise WorkflowError("bindings must be a list")
    clean = []
    for index, binding in enumerate(bindings):
        if not isinstance(binding, dict):
            raise WorkflowError(f"binding {index + 1} must be an object")
        source, node, input_name = binding.get("source", ""), binding.get("node", ""), binding.get("input", "")
        kind = binding.get("kind", "text")
        if isinstance(node, int) and not isinstance(node, bool):
            node = str(node)  # {"node": 6} means node "6"
        if not all(isinstance(value, str) for value in (source, node, input_name, kind)):
            raise WorkflowError(f"binding {index + 1}: source, node, input and kind must be text")
        if kind not in KINDS:
            raise WorkflowError(f"binding {index + 1}: kind must be one of {', '.join(KINDS)}")
        if not (source == "prompt" or source.startswith("params.") or source.startswith("references.")):
            raise WorkflowError(f"binding {index + 1}: source must be prompt, params.<name> or references.<n>")
        if source.startswith("references.") and not source.split(".", 1)[1].isdigit():
            raise WorkflowError(f"binding {index + 1}: references.<n> needs a number")
        if node not in workflow:
            raise WorkflowError(f"binding {index + 1}: the workflow has no node {node!r}")
        if not input_name or input_name not in workflow[node]["inputs"]:
            raise WorkflowError(f"binding {index + 1}: node {node} ({workflow[node]['class_type']}) has no input {input_name!r}")
        clean.append({"source": source, "node": node, "input": input_name, "kind": kind})
    return clean


def source_value(source: str, job):
    if source == "prompt":
        return job.prompt
    if source.startswith("params."):
        return (job.params or {}).get(source.split(".", 1)[1])
    index = int(source.split(".", 1)[1])
    references = job.references or []
    return references[index] if index < len(references) else None


def _coerce(value, current, kind: str, where: str):
    if kind == "text":
        text = "" if value is None else str(value)
        if isinstance(current, bool) or not isinstance(current, int | float):
            return text
        value = text  # a numeric input bound as text: coerce to the type it replaces
    try:
        if isinstance(current, float) or (kind == "number" and "." in str(value)):
            return float(value)
        return int(value)
    except (TypeError, ValueError):
        raise WorkflowError(f"{where} needs a number, got {str(value)[:40]!r}") from None


def load_reference(ref: str, owner_id: int) -> tuple[bytes, str, str]:
    """(bytes, content type, extension) of a draft reference: "ref:<sha256>" (an uploaded
    image of the same owner), "album:<id>" (an album item of the same owner), a data: URL,
    or an http(s) URL fetched through the guarded client."""
    from queue_app.engine import references
    from queue_app.models import AlbumItem

    ref = (ref or "").strip()
    if ref.startswith("ref:"):
        found = references.load(ref, owner_id)
        if found is None:
            raise WorkflowError(f"reference {ref[:20]!r} is not an uploaded image of this account")
        data, content_type = found
    elif ref.startswith("album:"):
        item = AlbumItem.objects.filter(id=ref[6:] if ref[6:].isdigit() else 0, owner_id=owner_id).first()
        if item is None or not item.file:
            raise WorkflowError(f"reference {ref!r} is not an album item of this account")
        with item.file.open("rb") as handle:
            data = handle.read()
        content_type = item.content_type
    elif ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        content_type = header[5:].split(";")[0] or "application/octet-stream"
        try:
            data = base64.b64decode(payload, validate=False) if ";base64" in header else payload.encode()
        except ValueError:
            raise WorkflowError("a data: reference is not valid base64") from None
    elif ref.startswith(("http://", "https://")):
        try:
            data, content_type = net.download(ref)
        except net.UnsafeURL as error:
            raise WorkflowError(f"reference URL refused: {error}") from None
    else:
        raise WorkflowError(f"unsupported reference {ref[:40]!r} (use ref:<sha256>, album:<id>, a data: URL or an https URL)")
    extension = mimetypes.guess_extension(content_type or "") or ".bin"
    return data, content_type, {".jpe": ".jpg", ".jpeg": ".jpg"}.get(extension, extension)


def content_name(data: bytes, extension: str) -> str:
    return hashlib.sha256(data).hexdigest()[:40] + extension


def build(workflow: dict, bindings: list, job, *, upload, rng=None) -> tuple[dict, dict]:
    """(prompt graph, seeds used). `upload(data, name, content_type) -> LoadImage value` is
    called for media references (content-addressed names)."""
    rng = rng or random.SystemRandom()
    graph = copy.deepcopy(validate_workflow(workflow))
    bound = set()
    recorded = dict((job.params or {}).get("seeds") or {})
    seeds = {}
    for binding in bindings:
        node, name, kind = binding["node"], binding["input"], binding["kind"]
        if node not in graph or name not in graph[node]["inputs"]:
            raise WorkflowError(f"a binding points at node {node} input {name!r}, which the workflow no longer has")
        bound.add((node, name))
        where = f"node {node} ({graph[node]['class_type']}) input '{name}'"
        value = source_value(binding["source"], job)
        current = graph[node]["inputs"][name]
        if kind == "seed":
            key = f"{node}.{name}"
            if value in (None, "", -1, "-1"):
                value = recorded.get(key, rng.randint(0, SEED_MAX))
            seeds[key] = graph[node]["inputs"][name] = _coerce(value, 0, "number", where)
        elif kind in MEDIA_KINDS:
            if value in (None, ""):
                continue  # the workflow's own file stays
            data, content_type, extension = load_reference(str(value), job.owner_id)
            graph[node]["inputs"][name] = upload(data, content_name(data, extension), content_type)
        elif value is not None and value != "":
            graph[node]["inputs"][name] = _coerce(value, current, kind, where)
        elif kind == "text" and binding["source"] == "prompt":
            graph[node]["inputs"][name] = ""
    for node_id, node in graph.items():
        for name in SEED_INPUTS:
            value = node["inputs"].get(name)
            if (node_id, name) in bound or isinstance(value, bool) or not isinstance(value, int):
                continue
            key = f"{node_id}.{name}"
            seeds[key] = node["inputs"][name] = int(recorded.get(key, rng.randint(0, SEED_MAX)))
    return graph, seeds
