"""The set-up helpers of the ComfyUI settings page (pure functions, no writes):

- `read_workflow_file`: an uploaded exported workflow (.json, API format; a UI-format file
  gets the message `workflow.validate_workflow` gives);
- the bindings picker: every settable input of the workflow (node → input) with a choice
  of draft field; `merge_picker` turns the choices into bindings, keeping raw-JSON
  bindings of inputs the picker does not show (a power user's own).
"""

import json

from django.core.exceptions import ValidationError

from comfy_app import workflow as wf
from queue_app import limits
from queue_app.sizes import human_bytes

MAX_WORKFLOW_BYTES = limits.WORKFLOW_FILE_BYTES
FIELD_PREFIX = "bind:"

# draft field → (binding source, kind)
CHOICES = {
    "prompt": ("prompt", "text", "Prompt"),
    "negative_prompt": ("params.negative_prompt", "text", "Negative prompt"),
    "seed": ("params.seed", "seed", "Seed"),
    "width": ("params.width", "number", "Size: width"),
    "height": ("params.height", "number", "Size: height"),
    "reference": ("references.0", "image", "Reference image"),
}


def read_workflow_file(upload) -> str:
    """The text of an uploaded workflow file, checked to be an API-format workflow."""
    if upload.size > MAX_WORKFLOW_BYTES:
        raise wf.WorkflowError(f"the workflow file is over {human_bytes(MAX_WORKFLOW_BYTES)}")
    try:
        data = limits.parse_json_text(
            upload.read(MAX_WORKFLOW_BYTES + 1),
            label="the workflow file",
            max_bytes=limits.WORKFLOW_BYTES,
            max_depth=limits.WORKFLOW_DEPTH,
        )
    except ValidationError as error:
        said = " ".join(error.messages)
        if "not valid JSON" in said or "not UTF-8" in said:
            said = "the workflow file is not JSON: export it with “Save (API Format)” in ComfyUI"
        raise wf.WorkflowError(said) from None
    wf.validate_workflow(data)
    return json.dumps(data, indent=2)


def _choice_of(binding: dict) -> str:
    for name, (source, _, _) in CHOICES.items():
        if binding.get("source") == source:
            return name
    return ""


def picker_rows(workflow: dict, bindings: list) -> list[dict]:
    """[{field, node, class_type, input, value, chosen}] for each input that holds a value
    (inputs linked to another node's output are not settable)."""
    bound = {(str(b.get("node")), str(b.get("input"))): _choice_of(b) for b in bindings or [] if isinstance(b, dict)}
    rows = []
    for node_id, node in (workflow or {}).items():
        if not isinstance(node, dict):
            continue
        for name, value in (node.get("inputs") or {}).items():
            if isinstance(value, list):  # a link [node, output]
                continue
            rows.append(
                {
                    "field": f"{FIELD_PREFIX}{node_id}:{name}",
                    "node": node_id,
                    "class_type": node.get("class_type", "?"),
                    "input": name,
                    "value": str(value)[:60],
                    "chosen": bound.get((node_id, name), ""),
                }
            )
    return rows


def merge_picker(post, raw_bindings: list, workflow: dict) -> list:
    """Bindings from the picker's choices (posted as bind:<node>:<input> = draft field):
    a choice is authoritative for its input; raw bindings of inputs the picker did not
    post are kept."""
    picked, shown = [], set()
    for key in post:
        if not key.startswith(FIELD_PREFIX):
            continue
        node, _, name = key[len(FIELD_PREFIX) :].partition(":")
        if node not in (workflow or {}) or name not in (workflow[node].get("inputs") or {}):
            continue
        shown.add((node, name))
        choice = post.get(key) or ""
        if choice in CHOICES:
            source, kind, _ = CHOICES[choice]
            picked.append({"source": source, "node": node, "input": name, "kind": kind})
    # Raw bindings are user JSON: any field may be a list or an object, which the binding
    # check refuses later with a form error; here they only must not be hashed.
    kept = [b for b in raw_bindings or [] if isinstance(b, dict) and (str(b.get("node")), str(b.get("input"))) not in shown]
    return kept + picked
