"""One declared schema per operation (issue 18 §6, issue 17): pydantic models that the
JSON API validates its bodies and queries with, that the MCP tools validate their
arguments with, and that both the OpenAPI document (/api/openapi.json) and the tools'
inputSchema/outputSchema are generated from. Bounds come from `queue_app.limits`,
enumerations from the model catalogue.

Bodies are strict: `"false"` is not a boolean, `"3"` is not a number, unknown fields are
refused. Queries (`?page=2`) are text by nature and are parsed leniently.
"""

import json
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from queue_app import limits
from queue_app.providers.catalogue import CATALOGUE
from queue_app.selectors.job_list import JOB_FILTER_STATES, MAX_PER_PAGE
from queue_app.services.errors import ServiceError

MAX_ID = 2**62


class SchemaError(ServiceError):
    """A request that does not fit its operation's schema: 400 with a readable message."""

    def __init__(self, message: str, code: int = 400, details: list | None = None, field: str | None = None):
        super().__init__(message, code, field=field)
        self.details = details or []


def _catalogue_values(attr: str) -> list[str]:
    values = {str(value) for family in CATALOGUE.values() for spec in family.values() for value in getattr(spec, attr)}
    return sorted(values)


ASPECT_RATIOS = _catalogue_values("aspect_ratios")
QUALITIES = _catalogue_values("qualities")
RESOLUTIONS = _catalogue_values("resolutions")
BACKGROUNDS = _catalogue_values("backgrounds")
FORMATS = _catalogue_values("formats")
MODELS = sorted({spec.id for family in CATALOGUE.values() for spec in family.values()})


def refuse(message: str):
    # A custom error keeps the message as written (no "Value error, " prefix).
    return PydanticCustomError("refused", message)


class Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class Query(Schema):
    """A query string: text by nature, so numbers and booleans are parsed from it, and
    names the operation does not know (a cache buster) are ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class Output(BaseModel):
    """Results may grow new fields; clients must ignore the ones they do not know."""

    model_config = ConfigDict(extra="allow")


ProjectId = Annotated[StrictInt, Field(ge=1, le=MAX_ID, description="a project id (integer)")]
ProviderId = Annotated[StrictInt, Field(ge=1, le=MAX_ID, description="a provider record id (integer)")]
JobId = Annotated[UUID, Field(description="a job id (UUID)")]
JobIds = Annotated[list[JobId], Field(min_length=1, max_length=limits.JOB_IDS, description="job ids (UUIDs)")]
Cursor = Annotated[StrictStr, Field(max_length=200, description="nextCursor of the last page")]
PageLimit = Annotated[StrictInt, Field(ge=1, le=limits.PAGE_SIZE, description="items per page")]
IdempotencyKey = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=200,
        description="Any unique text (a UUID): the same key with the same arguments replays the first result instead "
        "of doing the work twice; the same key with different arguments is refused (422); while the first call "
        "still runs, 409. Kept at least 24 hours.",
    ),
]


def idempotency_key_field():
    """The optional `idempotency_key` argument of the MCP tools that do work (the REST API
    takes the same key as the Idempotency-Key header)."""
    return Field(None, description="a repeat replays the first result")


def _option(values: list[str]):
    return Literal[tuple(values)]  # type: ignore[valid-type]


# --- Queue ------------------------------------------------------------------------------


class QueueStatusQuery(Query):
    breakdown: Literal["none", "projects", "providers", "all"] = Field(
        "none", description="also count per project, provider or both"
    )
    limit: int | None = Field(None, ge=1, le=1000, description="rows per breakdown")


class FailedScope(Schema):
    scope: Literal["all", "project", "provider"] | None = Field(None, description="all (default), project or provider")
    project_id: ProjectId | None = Field(None, description="only this project's")
    provider_id: ProviderId | None = Field(None, description="only this provider queue's")
    dry_run: StrictBool = Field(False, description="only count them")

    @model_validator(mode="after")
    def one_scope(self):
        if self.project_id is not None and self.provider_id is not None:
            raise refuse("project_id and provider_id are mutually exclusive: choose one scope")
        scope = self.scope or ("project" if self.project_id else "provider" if self.provider_id else "all")
        if scope == "all" and (self.project_id or self.provider_id):
            raise refuse("scope all takes no project_id or provider_id")
        if scope == "project" and self.project_id is None:
            raise refuse("scope project needs project_id")
        if scope == "provider" and self.provider_id is None:
            raise refuse("scope provider needs provider_id")
        self.scope = scope
        return self


class FailedResult(Output):
    dry_run: bool = Field(False, description="true when nothing was changed")
    affected: int | None = Field(None, description="with dry_run: how many jobs would be affected")
    cleared: int | None = Field(None, description="jobs deleted")
    retried: int | None = Field(None, description="jobs put back in the queue")
    project_id: int | None = None
    provider_id: int | None = None


# --- Drafts -----------------------------------------------------------------------------


class DraftOptions(Schema):
    model: StrictStr | None = Field(
        None,
        max_length=limits.MODEL_CHARS,
        description="a model or a provider's alias (default: the project's)",
    )
    aspect_ratio: _option(ASPECT_RATIOS) | None = Field(
        None, description="requested aspect ratio or size; mapped to the closest the model offers"
    )
    quality: _option(QUALITIES) | None = Field(None, description="requested quality; mapped to what the model offers")
    resolution: _option(RESOLUTIONS) | None = Field(None, description="requested resolution; mapped to what the model offers")
    format: _option(FORMATS) | None = Field(None, description="output file format")
    background: _option(BACKGROUNDS) | None = Field(None, description="image background (models that offer one)")
    sound: StrictStr | None = Field(None, max_length=limits.OPTION_CHARS, description="video sound: on or off")
    duration: StrictInt | None = Field(None, ge=limits.DURATION.low, le=limits.DURATION.high, description="video seconds")
    params: dict | None = Field(
        None,
        description=f"model-specific parameters ({limits.PARAMS_BYTES // 1024} KB at most)",
    )
    # An item may be a data: URI (stored as an upload), so its length is bounded by the body;
    # references.normalize checks each kind (URL length, image bytes and type).
    references: list[Annotated[StrictStr, Field(min_length=1, max_length=limits.REQUEST_BYTES)]] | None = Field(
        None,
        max_length=limits.REFERENCES,
        description="images: ref:<sha256>, album:<item id>, data: URI or https URL",
    )

    @model_validator(mode="after")
    def params_within_limits(self):
        if self.params is not None:
            try:
                limits.check_params(self.params)
            except Exception as error:  # django ValidationError: its message is the refusal
                raise refuse(" ".join(getattr(error, "messages", [str(error)]))) from None
        return self

    def values(self) -> dict:
        return self.model_dump(exclude_none=True, include=set(DraftOptions.model_fields))


class CreateDrafts(DraftOptions):
    prompt: StrictStr = Field(min_length=1, max_length=limits.PROMPT_CHARS, description="what to generate")
    quantity: StrictInt = Field(1, ge=limits.QUANTITY.low, le=limits.QUANTITY.high, description="how many drafts of it")
    provider_id: ProviderId | None = Field(None, description="default: the project's provider")
    settings: DraftOptions | None = Field(None, description="the same options, nested (the fields above win)")
    per_line: StrictBool = Field(False, description="quantity drafts per line of the prompt")

    def options(self) -> dict:
        nested = self.settings.values() if self.settings else {}
        return {**nested, **self.values()}


class CreateDraftsArgs(CreateDrafts):
    project_id: ProjectId
    idempotency_key: IdempotencyKey | None = idempotency_key_field()


class DraftRow(Output):
    id: str = Field(description="job id (UUID)")
    status: str


class DraftsCreated(Output):
    project_id: int
    count: int = Field(description="drafts created")
    jobs: list[DraftRow]
    resolved: dict = Field(
        description="what the drafts will run with if started now: provider, model and each output setting as the model "
        "offers it (an aspect ratio the model does not offer is mapped to its closest)"
    )
    adjusted: dict = Field(description="{setting: {requested, used}} for every requested value the model changed")


# --- Starting and retrying --------------------------------------------------------------


class StartJobs(Schema):
    job_ids: JobIds | None = Field(None, description="drafts or failed jobs")
    all_drafts: StrictBool = Field(False, description="every draft of the project")

    @model_validator(mode="after")
    def something_to_start(self):
        if self.all_drafts and self.job_ids:
            raise refuse("give job ids or all_drafts, not both")
        if not self.all_drafts and not self.job_ids:
            raise refuse("give job_ids or all_drafts: true")
        return self

    def ids(self) -> list[str] | None:
        return [str(job_id) for job_id in self.job_ids] if self.job_ids else None


class StartJobsArgs(StartJobs):
    project_id: ProjectId
    wait: StrictBool = Field(
        False,
        description="answer when they finish (SSE)",
    )
    wait_seconds: StrictInt = Field(120, ge=1, le=600, description="the longest wait")
    idempotency_key: IdempotencyKey | None = idempotency_key_field()


class JobsStarted(Output):
    started: list[str] = Field(description="ids of the jobs now pending")
    skipped: int = Field(description="selected jobs that were not drafts or failed jobs")
    finished: dict[str, int] | None = Field(None, description="with wait: the started jobs per status when the call ended")
    timed_out: bool | None = Field(None, description="with wait: true when wait_seconds passed before every job finished")
    poll: str | None = Field(None, description="with wait from a JSON-only client: it was not waited, poll instead")


class RetryJobs(Schema):
    job_ids: JobIds


class JobsRetried(Output):
    retried: list[str]
    skipped: int


class CancelJobs(Schema):
    job_ids: JobIds


class RunNextJobs(Schema):
    job_ids: JobIds = Field(description="pending jobs, the first given is the first run")


class RetryNow(Schema):
    job_ids: JobIds = Field(description="pending jobs waiting out a retry backoff")


class JobsRetriedNow(Output):
    retried_now: list[str]
    skipped: int


class ProviderRetriedNow(Output):
    retried_now: int = Field(description="jobs of its queue whose retry backoff ended now")


class JobsRunNext(Output):
    moved: list[str] = Field(description="the jobs now at the front of their provider's queue, in order")
    skipped: int


class JobsCancelled(Output):
    cancelled: int = Field(description="pending or processing jobs now failed with reason cancelled")
    skipped: int = Field(description="selected jobs that were drafts or already finished")


# --- Providers --------------------------------------------------------------------------


class ProviderUpdate(Schema):
    paused: StrictBool | None = Field(None, description="pause (true) or resume (false) the provider's queue")
    concurrency: StrictInt | None = Field(
        None,
        ge=limits.CONCURRENCY.low,
        le=limits.CONCURRENCY.high,
        description="parallel provider calls; lowering it never cancels running work",
    )

    @model_validator(mode="after")
    def something_to_change(self):
        if self.paused is None and self.concurrency is None:
            raise refuse("give paused (true/false) and/or concurrency")
        return self


class ProviderRow(Output):
    id: int
    name: str
    family: str
    paused: bool
    concurrency: int


# --- Job lists --------------------------------------------------------------------------


class PageQuery(Query):
    """A list paged by key: with `cursor` (empty for the first page) or `limit`, the answer
    is one page and `next_cursor` (null on the last); without either, the whole list."""

    cursor: str | None = Field(None, max_length=200, description="next_cursor of the last page (empty: the first)")
    limit: int | None = Field(None, ge=1, le=limits.PAGE_SIZE, description="rows per page")


class ProjectsQuery(PageQuery):
    archived: Literal["false", "true", "all"] = Field("false", description="archived projects: hidden, only them, or all")


class ProjectJobsQuery(Query):
    status: Literal[JOB_FILTER_STATES] = Field("all", description="which jobs")  # type: ignore[valid-type]
    page: int = Field(1, ge=1, le=10**9)
    cursor: str | None = Field(
        None, max_length=200, description="page by key instead: next_cursor of the last page (empty: the first)"
    )
    per_page: int = Field(50, ge=1, le=MAX_PER_PAGE)
    attempts: bool = Field(False, description="include each job's attempt log")


class AlbumQuery(Query):
    project_id: int | None = Field(None, ge=1, le=MAX_ID, description="only this project's items")
    cursor: str | None = Field(None, max_length=200, description="nextCursor of the previous page")
    limit: int = Field(50, ge=1, le=limits.PAGE_SIZE)


# --- Parsing ----------------------------------------------------------------------------


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes):
    """JSON as the specification defines it: no NaN or Infinity, no lone surrogates,
    bounded depth and size. Raises SchemaError (400, or 413 when too large)."""
    if len(raw) > limits.REQUEST_BYTES:
        raise SchemaError(f"the body is {len(raw)} bytes; the limit is {limits.REQUEST_BYTES}", 413)
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise SchemaError(f"the body is nested more than {limits.JSON_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError):
        raise SchemaError("the body is not valid JSON") from None
    try:
        limits.check_json(value, label="the body", max_bytes=limits.REQUEST_BYTES, max_depth=limits.JSON_DEPTH)
    except Exception as error:
        raise SchemaError(" ".join(getattr(error, "messages", [str(error)]))) from None
    return value


def _where(location: tuple) -> str:
    return ".".join(str(part) for part in location)


def validate(schema: type[BaseModel], data):
    """`data` as an instance of `schema`, or a SchemaError naming each bad field."""
    if not isinstance(data, dict):
        raise SchemaError("the body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        problems, field = [], None
        for item in error.errors(include_url=False, include_input=False, include_context=False):
            field = field or (str(item["loc"][0]) if item["loc"] else None)
            where = _where(item["loc"])
            message = "unknown field" if item["type"] == "extra_forbidden" else item["msg"]
            problems.append(f"{where}: {message}" if where else message)
        raise SchemaError("; ".join(problems), details=problems, field=field) from None


def validate_query(schema: type[BaseModel], query) -> BaseModel:
    """A query string (one value per name) against a query schema."""
    data = {key: query.get(key) for key in query if query.get(key) not in (None, "")}
    return validate(schema, data)
