"""What every MCP tool is made of: the call's Context, the Tool row (arguments and result
as pydantic models, annotations, handler), and its description made small enough for a
model to read the whole list (tools/list under 12 KB)."""

from dataclasses import dataclass, field

from pydantic import BaseModel

from queue_app.services.idempotency import idempotent

READ = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
# Work that calls provider APIs (the open world) and may spend money; a repeat may pick up
# rows that changed meanwhile (new drafts, jobs that failed again), so it is not idempotent.
STARTS_WORK = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": True}
CREATES = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": False}
CHANGES = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
DELETES = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": False}


@dataclass
class Context:
    user: object
    base_url: str  # scheme://host of the request, for output links
    extra_content: list = field(default_factory=list)  # content items beside the JSON text


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[BaseModel]
    result: type[BaseModel]
    annotations: dict
    run: object  # (Context, arguments) -> dict
    loose: tuple = ()  # catalogue-wide enums sent as plain strings (project_options lists them)
    terse: tuple = ()  # fields another tool already describes: their types only

    def describe(self) -> dict:
        # no display title: the name reads well, and a model reads every byte of the list
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": compact(self.arguments.model_json_schema(), loose=self.loose, terse=self.terse),
            "outputSchema": shallow(self.result.model_json_schema()),
            "annotations": hints(self.annotations),
        }


# The specification's defaults: a hint left out means this (a read-only tool's other two
# hints mean nothing), so only the others are sent.
DEFAULT_HINTS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}


def hints(annotations: dict) -> dict:
    sent = {name: value for name, value in annotations.items() if DEFAULT_HINTS.get(name) != value}
    if annotations.get("readOnlyHint"):
        sent.pop("destructiveHint", None)
        sent.pop("idempotentHint", None)
    return sent


# Accepted, not advertised: the API's nested copy of the draft options (the flat ones
# suffice), and a failed-jobs scope that project_id or provider_id already says.
HIDDEN = ("settings", "scope")


def compact(schema: dict, *, loose=(), terse=()) -> dict:
    """An input schema without what a model need not read: titles, the nested `settings`
    copy, `anyOf [T, null]` of optional values (leaving one out is how to not set it), and
    enumerations of the `loose` fields."""
    properties = {
        name: _small(prop, loose=name in loose) for name, prop in schema.get("properties", {}).items() if name not in HIDDEN
    }
    for name in terse:
        properties[name].pop("description", None)
    small = {"type": "object", "properties": properties}
    if schema.get("required"):
        small["required"] = schema["required"]
    return small


# Bounds the server checks anyway (a refusal names the field and the bound): not worth a
# model's reading on every turn.
DROPPED = (
    "title",
    "maxLength",
    "minLength",
    "maximum",
    "minimum",
    "maxItems",
    "minItems",
    "additionalProperties",
    "maxProperties",
    "ge",
    "le",
    "format",
)


# What the name and type already say.
GENERIC = {
    "a project id (integer)",
    "a provider record id (integer)",
    "a job id (UUID)",
    "job ids (UUIDs)",
    "items per page",
    "what to generate",
    "how many drafts of it",
    "archive (true) or restore (false)",
    "what its jobs make",
    "write-only",
    "rows per breakdown",
    "nextCursor of the last page",
    "also count per project, provider or both",
}


def _small(prop: dict, *, loose: bool) -> dict:
    options = prop.get("anyOf")
    if options:
        kept = [option for option in options if option != {"type": "null"}]
        rest = {key: value for key, value in prop.items() if key != "anyOf"}
        prop = {**kept[0], **rest} if len(kept) == 1 else {**rest, "anyOf": [_small(o, loose=False) for o in kept]}
    prop = {key: value for key, value in prop.items() if key not in DROPPED}
    if "default" in prop and (prop["default"] is None or prop["default"] is False):
        del prop["default"]
    if prop.get("description") in GENERIC:
        del prop["description"]
    if loose and "enum" in prop:
        prop = {"type": "string"}  # project_options says what the model offers
    if prop.get("anyOf") in ([{"type": "number"}, {"type": "integer"}], [{"type": "integer"}, {"type": "number"}]):
        prop = {"type": "number", **{k: v for k, v in prop.items() if k != "anyOf"}}
    if isinstance(prop.get("items"), dict):
        prop["items"] = _small(prop["items"], loose=False)
    return prop


def described_once(tools: list[dict]) -> list[dict]:
    """The described tools with an argument's description left out where an earlier tool
    gives the same argument the same words (`terse`, for every tool at once): room in the
    list for one more tool."""
    seen = set()
    for tool in tools:
        for name, prop in tool["inputSchema"].get("properties", {}).items():
            said = (name, prop.get("description"))
            if said[1] is not None and said in seen:
                del prop["description"]
            seen.add(said)
    return tools


def shallow(schema: dict) -> dict:
    """An output schema naming the top-level fields every result has: what an agent
    branches on, in a fraction of the bytes of the nested schema (the JSON API's OpenAPI
    document has the whole of it)."""
    return {"type": "object", "required": list(schema.get("properties", {}))}


def once(ctx: Context, args, *, scope: str, run, exclude=()) -> dict:
    """`run()` (payload, status) done once per idempotency key: the same key with the same
    arguments replays the first payload. The fingerprint is the arguments as the REST body
    they mirror (`exclude`: the ones the REST call carries in its path or not at all)."""
    body = args.model_dump(mode="json", exclude_none=True, exclude_defaults=True, exclude={"idempotency_key", *exclude})
    payload, _ = idempotent(user=ctx.user, key=args.idempotency_key, scope=scope, body=body, run=run)
    return payload
