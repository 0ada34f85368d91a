"""Schemas of the combinations generator and the wildcard lists (issue 29), shared by the
JSON API, MCP and the OpenAPI document like those of `schemas.py`."""

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from queue_app import limits
from queue_app.services.combinations import ITEM_TYPES
from queue_app.web.schemas import IdempotencyKey, JobIds, Output, ProjectId, ProviderId, Schema, idempotency_key_field


class WorkflowItem(Schema):
    type: Literal[ITEM_TYPES] = Field(description="prompt, reference, or an option: " + ", ".join(ITEM_TYPES[2:]))
    value: StrictStr | StrictInt = Field(
        description="the prompt part (wildcards {a|b} and __list__ allowed), the reference (ref:…, album:…, a URL), "
        "or the option's value (duration and seed: whole numbers)"
    )
    enabled: StrictBool = Field(True, description="a disabled item stays in the workflow but makes no drafts")


class GenerateDrafts(Schema):
    workflow: Annotated[list[WorkflowItem], Field(max_length=limits.WORKFLOW_ITEMS)] | None = Field(
        None, description="the items to cross (default: the project's stored workflow)"
    )
    quantity: StrictInt | None = Field(
        None,
        ge=limits.GENERATED_DRAFTS.low,
        le=limits.GENERATED_DRAFTS.high,
        description="drafts to make (default: one per combination; more cycle through them again)",
    )
    mode: Literal["ordered", "random"] = Field("ordered", description="combinations in order, or drawn with a seed")
    seed: StrictInt | None = Field(None, ge=0, le=limits.SEED.high, description="the random mode's seed")
    on_too_long: Literal["cancel", "truncate"] = Field(
        "cancel", description="a prompt longer than its model takes: refuse the batch, or cut it"
    )
    save: StrictBool = Field(False, description="store `workflow` as the project's workflow")
    create: StrictBool = Field(False, description="create the drafts (false: only count and preview them)")


class GenerateDraftsArgs(Schema):
    """MCP's: the project's stored workflow (the page or the API sets it), and a seed means
    the random mode, so the tool list stays small."""

    project_id: ProjectId
    quantity: StrictInt | None = Field(None, ge=limits.GENERATED_DRAFTS.low, le=limits.GENERATED_DRAFTS.high)
    seed: StrictInt | None = Field(None, ge=0, le=limits.SEED.high, description="random order")
    on_too_long: Literal["cancel", "truncate"] | None = None  # cancel
    create: StrictBool = False
    idempotency_key: IdempotencyKey | None = idempotency_key_field()


class DraftPreview(Output):
    prompt: str
    references: list[str]
    settings: dict


class DimensionCount(Output):
    type: str
    count: int


class DraftsGenerated(Output):
    project_id: int
    combinations: int = Field(description="how many distinct drafts the workflow makes")
    drafts: int = Field(description="drafts asked for (or made)")
    repeats: int = Field(description="drafts that repeat a combination")
    mode: str
    seed: int | None = Field(description="the random mode's seed: the same seed makes the same batch")
    dimensions: list[DimensionCount] = Field(description="each crossed type and its number of alternatives")
    too_long: int = Field(description="drafts whose prompt was longer than their model takes (truncated)")
    previews: list[DraftPreview] = Field(description="the first drafts, in order")
    job_ids: list[str] = Field(description="the drafts created (empty for a preview)")


class DraftsGeneratedBrief(Output):
    """MCP's result: DraftsGenerated (the other fields come too; fewer are declared)."""

    combinations: int
    drafts: int
    previews: list[DraftPreview]
    job_ids: list[str]


class Workflow(Output):
    project_id: int
    items: list[dict]


class WildcardListIn(Schema):
    name: StrictStr = Field(min_length=1, max_length=limits.WILDCARD_NAME_CHARS, description="used as __name__ in prompts")
    values: Annotated[list[StrictStr], Field(min_length=1, max_length=limits.WILDCARD_VALUES)]


class WildcardListOut(Output):
    name: str
    values: list[str]


class WildcardLists(Output):
    lists: list[WildcardListOut]


class ReuseJobs(Schema):
    job_ids: JobIds | None = Field(None, description="jobs of the project to do again (any status)")
    album_item_ids: Annotated[list[StrictInt], Field(min_length=1, max_length=limits.JOB_IDS)] | None = Field(
        None, description="or album items: their jobs"
    )
    prompt: StrictStr = Field("", max_length=limits.PROMPT_CHARS, description="the new prompt; {prompt} is the job's own")
    provider_id: ProviderId | None = Field(None, description="another provider record")
    provider_ids: Annotated[list[ProviderId], Field(min_length=1, max_length=20)] | None = Field(
        None, description="fan out: one new draft per job and provider record"
    )
    settings: dict | None = Field(None, description="settings to change (model, aspect_ratio, …, references)")


class DraftsReused(Output):
    project_id: int
    job_ids: list[str]


class PromptTemplateIn(Schema):
    name: StrictStr = Field(min_length=1, max_length=100)
    text: StrictStr = Field(min_length=1, max_length=limits.PROMPT_CHARS)


class PromptTemplates(Output):
    templates: list[dict]


class RecentPrompts(Output):
    project_id: int
    prompts: list[str]
