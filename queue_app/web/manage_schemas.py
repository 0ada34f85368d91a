"""The declared bodies of the management routes (projects, providers, one draft, the
reference upload), for the OpenAPI document. Their fields are the ones the services take
(PROJECT_FIELDS, PROVIDER_FIELDS, the draft PATCH keys), and a test holds the two to each
other; the services check the values, with the same bounds (queue_app.limits)."""

from typing import Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from queue_app import limits
from queue_app.models.choices import Family, Kind
from queue_app.web.schemas import DraftOptions, Output, ProviderId, Schema


class ProjectFields(Schema):
    name: StrictStr | None = Field(None, min_length=1, max_length=200)
    kind: Literal[tuple(Kind.values)] | None = Field(None, description="what its jobs make")  # type: ignore[valid-type]
    provider_id: ProviderId | None = Field(None, description="null: none")
    model: StrictStr | None = Field(None, max_length=limits.MODEL_CHARS)
    aspect_ratio: StrictStr | None = Field(None, max_length=limits.OPTION_CHARS)
    quality: StrictStr | None = Field(None, max_length=limits.OPTION_CHARS)
    resolution: StrictStr | None = Field(None, max_length=limits.OPTION_CHARS)
    format: StrictStr | None = Field(None, max_length=10)
    background: StrictStr | None = Field(None, max_length=20)
    sound: StrictStr | None = Field(None, max_length=10)
    system_prompt: StrictStr | None = Field(None, max_length=limits.PROMPT_CHARS)
    duration: StrictInt | None = Field(None, ge=limits.DURATION.low, le=limits.DURATION.high)
    temperature: StrictFloat | StrictInt | None = Field(None, ge=0, le=2)
    max_tokens: StrictInt | None = Field(None, ge=1, le=1_000_000)
    share_weight: StrictInt | None = Field(None, ge=limits.SHARE_WEIGHT.low, le=limits.SHARE_WEIGHT.high)


class ProjectCreate(ProjectFields):
    name: StrictStr = Field(min_length=1, max_length=200)


class ProjectPatch(ProjectFields):
    archived: StrictBool | None = Field(None, description="archive (true) or restore (false)")


class ProviderFields(Schema):
    name: StrictStr | None = Field(None, min_length=1, max_length=100)
    family: Literal[tuple(Family.values)] | None = None  # type: ignore[valid-type]
    base_url: StrictStr | None = Field(None, max_length=200, description="scheme, host, port and path only")
    api_key: StrictStr | None = Field(None, max_length=2000, description="write-only")
    api_secret: StrictStr | None = Field(None, max_length=2000, description="write-only")
    concurrency: StrictInt | None = Field(None, ge=limits.CONCURRENCY.low, le=limits.CONCURRENCY.high)
    max_attempts: StrictInt | None = Field(None, ge=limits.MAX_ATTEMPTS.low, le=limits.MAX_ATTEMPTS.high)
    paused: StrictBool | None = None
    options: dict | None = Field(None, description="family options")
    model_aliases: dict[str, StrictStr] | None = Field(None, max_length=100, description="alias: catalogue model")


class ProviderCreate(ProviderFields):
    name: StrictStr = Field(min_length=1, max_length=100)
    family: Literal[tuple(Family.values)]  # type: ignore[valid-type]


class DraftPatch(DraftOptions):
    prompt: StrictStr | None = Field(None, min_length=1, max_length=limits.PROMPT_CHARS)
    provider_id: ProviderId | None = Field(None, description="run on this provider record (null: the project's)")
    settings: DraftOptions | None = Field(None, description="the same options, nested (the fields above win)")


class ReferenceUploaded(Output):
    reference: str = Field(description='"ref:<sha256>": what a draft\'s references name')
    sha256: str
    content_type: str
    size: int
    width: int | None
    height: int | None


REFERENCE_UPLOAD = {
    "type": "object",
    "properties": {"file": {"type": "string", "format": "binary", "description": "one PNG, JPEG, WebP or GIF image"}},
    "required": ["file"],
}
