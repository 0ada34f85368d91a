"""The MCP tools' own schemas: lists, lookups and the results agents read, beside the
operation schemas they share with the JSON API (`queue_app.web.schemas`). Bounds come from
`queue_app.limits`."""

from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr

from queue_app import limits
from queue_app.selectors.job_list import JOB_FILTER_STATES
from queue_app.web.manage_schemas import DraftPatch, ProjectPatch, ProviderFields
from queue_app.web.schemas import (
    CancelJobs,
    Cursor,
    IdempotencyKey,
    JobId,
    Output,
    PageLimit,
    ProjectId,
    ProviderId,
    QueueStatusQuery,
    RetryJobs,
    Schema,
    StartJobs,
    idempotency_key_field,
)


class QueueStatusArgs(QueueStatusQuery):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ListArgs(Schema):
    cursor: Cursor | None = None
    limit: PageLimit = 50


class ListJobsArgs(ListArgs):
    project_id: ProjectId | None = None
    provider_id: ProviderId | None = Field(None, description="its queue")
    status: Literal[JOB_FILTER_STATES] = Field(  # type: ignore[valid-type]
        "active", description="active: pending, processing, failed"
    )


class ProjectArgs(Schema):
    project_id: ProjectId


class ProviderArgs(Schema):
    provider_id: ProviderId


class SetConcurrencyArgs(ProviderArgs):
    concurrency: StrictInt = Field(
        ge=limits.CONCURRENCY.low, le=limits.CONCURRENCY.high, description="parallel provider calls of this provider record"
    )


class JobArgs(Schema):
    job_id: JobId
    include_images: StrictBool = Field(False, description="inline small images too")


class CancelJobsArgs(CancelJobs):
    idempotency_key: IdempotencyKey | None = idempotency_key_field()


class RetryJobsArgs(RetryJobs):
    idempotency_key: IdempotencyKey | None = idempotency_key_field()


class QueueStatusOut(Output):
    totals: dict = Field(description="pending, processing, failed, queued, waiting, running, stalled, detached, slots")


class ProjectDefaults(Output):
    """The settings a project's new drafts start from ("" or null: the model's default)."""

    aspect_ratio: str
    quality: str
    resolution: str
    format: str
    background: str
    duration: int | None
    sound: str
    system_prompt: str
    temperature: float | None
    max_tokens: int | None


class ProjectOut(Output):
    """A project, the same from the JSON API and the MCP tools (selectors.projects.project_json)."""

    id: int
    name: str
    kind: str
    provider_id: int | None
    model: str
    archived: bool
    share_weight: int
    defaults: ProjectDefaults
    counts: dict[str, int] | None = Field(description="jobs per status, every status; null where a list does not read them")
    created_at: str
    updated_at: str


class ProjectPage(Output):
    projects: list[ProjectOut]
    nextCursor: str | None = Field(None, description="pass as cursor for the next page; absent on the last")


class ProjectList(Output):
    projects: list[ProjectOut]


class ProjectDetail(ProjectOut):
    counts: dict[str, int] = Field(description="jobs per status, every status")


class CostRow(Output):
    provider_id: int | None
    provider_name: str
    currency: str = Field(description="what the provider record is billed in (USD, EUR, Buzz, coins, …); no exchange rates")
    jobs: int
    unknown: int = Field(description="jobs of this row whose price is unknown (not counted in amount)")
    amount: str | None = Field(description="decimal sum of the known estimates; null when none is known")


class CostEstimate(Output):
    jobs: int = Field(description="jobs estimated")
    partial: bool = Field(description="true when only the first 5,000 were estimated")
    by_provider: list[CostRow]
    totals: dict[str, str] = Field(description="known estimates summed per currency")
    unknown: int = Field(description="jobs with an unknown price: never counted as 0")


class EstimateArgs(StartJobs):
    project_id: ProjectId


class ProjectView(ProjectDetail):
    footprint: dict[str, int] = Field(description="what deleting the project removes: jobs, active jobs, album items, bytes")
    storage: dict = Field(description="the owner's album usage and what starting the drafts would reserve")
    cost: CostEstimate = Field(description="what starting all the drafts would cost, per provider record and currency")


class ProviderOut(Output):
    id: int
    name: str
    family: str
    paused: bool
    concurrency: int
    active_slots: int = Field(description="jobs holding a slot now")


class ProviderPage(Output):
    providers: list[ProviderOut]
    nextCursor: str | None = None


class JobOut(Output):
    id: str
    project_id: int
    status: str = Field(description="draft, pending, processing, completed or failed")
    state: str = Field(description="derived state: waiting, queued, running, stalled, detached, or the status")
    waiting_reason: str
    error: str


class JobPage(Output):
    jobs: list[JobOut]
    total: int
    nextCursor: str | None = None


class OutputLink(Output):
    id: int
    index: int
    role: str
    kind: str
    content_type: str
    size: int = 0
    url: str | None = Field(None, description="the file with the API token; also its resource URI (resources/read)")
    download_url: str | None = Field(None, description="the file without credentials, for 15 minutes")
    text: str | None = None


class AlbumItemOut(OutputLink):
    project_id: int
    job_id: str | None
    width: int | None
    height: int | None
    created_at: str


class AlbumPage(Output):
    items: list[AlbumItemOut]
    nextCursor: str | None = Field(None, description="pass as cursor for the next page; null on the last")


class JobDetail(JobOut):
    resolved: dict | None = Field(description="the settings the job was claimed with (null until it first ran)")
    attempt_log: list[dict]
    outputs: list[OutputLink]


# --- management and discovery (issue 32) -------------------------------------------------


class SaveProjectArgs(ProjectPatch):
    project_id: ProjectId | None = Field(None, description="omit to create one")
    idempotency_key: IdempotencyKey | None = idempotency_key_field()


class SaveProviderArgs(ProviderFields):
    provider_id: ProviderId | None = Field(None, description="omit to create one")
    idempotency_key: IdempotencyKey | None = idempotency_key_field()


class UpdateDraftArgs(DraftPatch):
    job_id: JobId


class DeleteArgs(Schema):
    kind: Literal["project", "provider", "draft", "album_item"]
    id: StrictInt | JobId = Field(description="a draft's job id (UUID); otherwise an integer")


class ListAlbumArgs(ListArgs):
    project_id: ProjectId | None = None


class ProjectOptionsArgs(Schema):
    project_id: ProjectId
    provider_id: ProviderId | None = Field(None, description="a draft's own provider (default: the project's)")
    model: StrictStr | None = Field(None, max_length=limits.MODEL_CHARS, description="a model (default: the project's)")


class ProviderRecord(Output):
    """A provider as the API shows it: never its key, at most the key's last four."""

    id: int
    name: str
    family: str
    base_url: str
    key_hint: str
    has_key: bool
    concurrency: int
    max_attempts: int
    paused: bool


class Deleted(Output):
    deleted: bool | int


class DraftOut(Output):
    id: str
    status: str
    prompt: str
    provider_id: int | None
    settings: dict


class ProjectOptions(Output):
    project_id: int
    kind: str
    provider_id: int | None
    family: str
    model: str = Field(description="the model these options are for")
    models: list[str] = Field(description="models the provider offers for the project's kind (its aliases too)")
    options: dict[str, list[str]] = Field(description="setting -> the values the model offers (absent: not offered)")
    defaults: dict = Field(description="the project's default settings")
    comfyui_inputs: list[dict] | None = Field(None, description="a ComfyUI workflow's bound inputs: source, node, input")
