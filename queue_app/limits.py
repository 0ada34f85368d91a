"""Every bounded value of the app, declared once (issue 18 §2).

The model fields' validators, the database check constraints, the forms and the admin
(both through the model validators), the JSON API and the MCP tools (through the
operation schemas in `queue_app.web.schemas`) all read these numbers: change one here and
every door moves together. `check_json` is the one walk that bounds free-form JSON
(params, workflows) by size and nesting depth.
"""

import json
import math
from dataclasses import dataclass

from django import forms
from django.core.exceptions import ValidationError
from django.db import models


@dataclass(frozen=True)
class Range:
    low: int | float
    high: int | float
    label: str

    def message(self) -> str:
        kind = "number" if isinstance(self.low, float) else "whole number"
        return f"{self.label} must be a {kind} from {self.low} to {self.high}"

    def contains(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, float) and (not math.isfinite(value) or isinstance(self.low, int)):
            return False
        return self.low <= value <= self.high

    def validator(self):
        """A Django field validator (deconstructible, so migrations can record it)."""
        return RangeValidator(self.low, self.high, self.label)


class RangeValidator:
    def __init__(self, low, high, label):
        self.low, self.high, self.label = low, high, label

    def __call__(self, value):
        if value is not None and not Range(self.low, self.high, self.label).contains(value):
            raise ValidationError(Range(self.low, self.high, self.label).message(), code="limit")

    def deconstruct(self):
        return ("queue_app.limits.RangeValidator", (self.low, self.high, self.label), {})

    def __eq__(self, other):
        return isinstance(other, RangeValidator) and (self.low, self.high, self.label) == (other.low, other.high, other.label)


# --- Providers ----------------------------------------------------------------------------
# Concurrency: parallel provider calls per provider record. Dispatch's cost follows the
# jobs it claims, never this number; the bound keeps a typo from meaning "unlimited".
CONCURRENCY = Range(1, 1000, "concurrency")
MAX_ATTEMPTS = Range(1, 20, "max_attempts")
# A project's weight in fair share (engine/fair_share.py): 1 is everyone's default; a
# thousand-fold share is past any sensible mix and keeps the arithmetic small.
SHARE_WEIGHT = Range(1, 1000, "share_weight")
# Status requests a minute a record's poller may send (providers/budget.py); the default is
# the family's documented limit. 1,000 a second is past every documented limit.
STATUS_PER_MINUTE = Range(1, 60_000, "status_per_minute")

# Demo provider options (`Provider.options` of a demo record).
DEMO_LAYERS = Range(1, 16, "layers")  # the adapters' MAX_LAYERS: one composite and at most 16 layers
DEMO_LATENCY_MS = Range(0, 600_000, "latency_ms")
DEMO_FAIL_RATE = Range(0.0, 1.0, "fail_rate")
DEMO_RETRY_AFTER = Range(0, 3600, "retry_after")

# --- Drafts -------------------------------------------------------------------------------
QUANTITY = Range(1, 500, "quantity")  # drafts per request
PROMPT_CHARS = 32_000
DURATION = Range(1, 600, "duration")
MODEL_CHARS = 200
OPTION_CHARS = 30  # aspect_ratio, quality, resolution, format, background, sound
PARAMS_BYTES = 16 * 1024
PARAMS_DEPTH = 8
REFERENCES = 16  # references per draft
REFERENCE_CHARS = 2048  # one reference given as a URL
REFERENCE_BYTES = 20 * 1024 * 1024  # one reference image (an upload, a data: URI the API stores, a URL fetched)
# New reference files one draft form or upload request carries in all (more: over several
# requests, or one at a time through POST /api/references). The edge (remixstudio/edge.py)
# refuses a larger upload body before reading it.
UPLOAD_BYTES = 64 * 1024 * 1024
# Uploaded references no draft names any more are deleted after this long (queue service).
REFERENCE_GRACE_SECONDS = 24 * 3600
JOB_IDS = 500  # job ids per start / retry request
# The combinations generator (services/combinations.py): drafts one request makes, the
# combinations a workflow may hold, its items, a wildcard list's values, a seed.
GENERATED_DRAFTS = Range(1, 10_000, "quantity")
COMBINATIONS = 100_000
WORKFLOW_ITEMS = 200
WILDCARD_VALUES = 1000
WILDCARD_NAME_CHARS = 60
SEED = Range(0, 2**32 - 1, "seed")

# --- Images -------------------------------------------------------------------------------
# Decoded pixels of any image we open (outputs, posters, references), read from the header
# before anything is decoded: 8192 × 8192. A tiny file can claim far more and cost a
# worker gigabytes to decode.
IMAGE_PIXELS = 8192 * 8192

# --- ComfyUI ------------------------------------------------------------------------------
WORKFLOW_BYTES = 2 * 1024 * 1024
WORKFLOW_FILE_BYTES = 5 * 1024 * 1024  # an exported workflow file (indented, so larger)
WORKFLOW_DEPTH = 12
WORKFLOW_NODES = 2000
COMFY_ALLOWED_HOSTS = 100  # private hosts staff allow (every ComfyUI check reads the list)

# --- Requests -----------------------------------------------------------------------------
REQUEST_BYTES = 1024 * 1024  # a JSON API or MCP body
JSON_DEPTH = 32  # any JSON body
PAGE_SIZE = 200  # list endpoints and MCP list tools
# The form fields of one page request, files aside (Django's DATA_UPLOAD_MAX_MEMORY_SIZE):
# room for a pasted workflow shown indented.
FORM_BYTES = 5 * 1024 * 1024
# Any request body but an upload's, refused at the edge before it is read: a form with a
# workflow file, or the API's 1 MiB, fits.
BODY_BYTES = FORM_BYTES + WORKFLOW_FILE_BYTES
# An upload in memory before Django spools it to a temporary file (FILE_UPLOAD_MAX_MEMORY_SIZE).
UPLOAD_MEMORY_BYTES = 1024 * 1024
BULK_SELECTED = 1000  # jobs ticked for one of the monitor's bulk actions
FORM_FIELDS = 2 * BULK_SELECTED  # fields of one form (Django's DATA_UPLOAD_MAX_NUMBER_FIELDS): room for them
WEBSOCKET_MESSAGE_BYTES = 128 * 1024  # one frame to the live socket (it answers larger than 4 KB with an error)

# --- Per user: what fans out ---------------------------------------------------------------
PUSH_SUBSCRIPTIONS = 10  # every finished project posts to each one
API_TOKENS = 20


def check_json(value, *, label: str, max_bytes: int, max_depth: int) -> None:
    """Refuse JSON that is too deep, too big or not plain JSON (NaN, Infinity, lone
    surrogates). Iterative, so a hostile depth cannot exhaust the Python stack."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise ValidationError(f"{label} is nested more than {max_depth} levels deep", code="limit")
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                raise ValidationError(f"{label} keys must be text", code="limit")
            stack.extend((child, depth + 1) for child in item.values())
            stack.extend((key, depth + 1) for key in item)
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValidationError(f"{label} holds NaN or Infinity, which JSON does not allow", code="limit")
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValidationError(f"{label} holds text that is not valid Unicode", code="limit") from None
            if "\x00" in item:  # PostgreSQL stores no NUL in text or jsonb: refuse it here, not with a 500
                raise ValidationError(f"{label} holds a NUL character (\\u0000), which cannot be stored", code="limit")
        elif item is not None and not isinstance(item, bool | int | float):
            raise ValidationError(f"{label} holds a value JSON cannot carry", code="limit")
    size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    if size > max_bytes:
        raise ValidationError(f"{label} is {size} bytes; the limit is {max_bytes}", code="limit")


def parse_json_text(text, *, label: str, empty=None, max_bytes: int = FORM_BYTES, max_depth: int = JSON_DEPTH):
    """JSON a person or a client gave as text (a form field, an uploaded file): its value
    (`empty` for blank text), bounded by `check_json`, or ValidationError — never the
    RecursionError Python's parser (or a later recursive walk) raises on deep nesting."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValidationError(f"{label} is not UTF-8 text", code="limit") from None
    if not text.strip():
        return empty
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValidationError(f"{label} is nested more than {max_depth} levels deep", code="limit") from None
    except ValueError as error:
        raise ValidationError(f"{label} is not valid JSON: {error}", code="limit") from None
    check_json(value, label=label, max_bytes=max_bytes, max_depth=max_depth)
    return value


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


class JSONFormField(forms.JSONField):
    """Django's JSON form field (the admin's), bounded: deep nesting is a form error, not
    the 500 Django's own field lets Python's RecursionError become."""

    def to_python(self, value):
        try:
            converted = super().to_python(value)
        except RecursionError:
            raise ValidationError(f"the JSON is nested more than {JSON_DEPTH} levels deep", code="limit") from None
        if converted is not None and not self.disabled:
            check_json(converted, label="the JSON", max_bytes=FORM_BYTES, max_depth=JSON_DEPTH)
        return converted

    def bound_data(self, data, initial):
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return forms.fields.InvalidJSONInput(data)


# For a ModelAdmin's `formfield_overrides`: every JSON column edited through the bounded field.
ADMIN_FORMFIELDS = {models.JSONField: {"form_class": JSONFormField}}


def check_params(value) -> None:
    if not isinstance(value, dict):
        raise ValidationError("params must be an object", code="limit")
    check_json(value, label="params", max_bytes=PARAMS_BYTES, max_depth=PARAMS_DEPTH)
    if "layers" in value and not DEMO_LAYERS.contains(value["layers"]):
        raise ValidationError(DEMO_LAYERS.message(), code="limit")


def check_references(value) -> None:
    if not isinstance(value, list) or len(value) > REFERENCES:
        raise ValidationError(f"references must be a list of at most {REFERENCES} items", code="limit")
    if not all(isinstance(item, str) and 0 < len(item) <= REFERENCE_CHARS for item in value):
        raise ValidationError(f"each reference must be text of 1 to {REFERENCE_CHARS} characters", code="limit")


DEMO_OPTIONS = {
    "layers": DEMO_LAYERS,
    "latency_ms": DEMO_LATENCY_MS,
    "fail_rate": DEMO_FAIL_RATE,
    "retry_after": DEMO_RETRY_AFTER,
    "status_per_minute": STATUS_PER_MINUTE,  # every family's, not only the demo's
}


def check_provider_options(value) -> None:
    if not isinstance(value, dict):
        raise ValidationError("options must be an object", code="limit")
    check_json(value, label="options", max_bytes=PARAMS_BYTES, max_depth=PARAMS_DEPTH)
    for key, bound in DEMO_OPTIONS.items():
        if key in value and not bound.contains(value[key]):
            raise ValidationError(bound.message(), code="limit")


def check_workflow(value) -> None:
    if not isinstance(value, dict):
        raise ValidationError("the workflow must be a JSON object of nodes", code="limit")
    if len(value) > WORKFLOW_NODES:
        raise ValidationError(f"the workflow has {len(value)} nodes; the limit is {WORKFLOW_NODES}", code="limit")
    check_json(value, label="the workflow", max_bytes=WORKFLOW_BYTES, max_depth=WORKFLOW_DEPTH)
