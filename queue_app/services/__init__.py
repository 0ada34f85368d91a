"""Write services: everything pages, the API, admin, MCP and commands change goes
through here (`<entity>_<action>`, keyword-only arguments).

One module per entity; this package re-exports every name so `services.jobs_start(...)`
keeps working. Inside the package, modules import from their sibling, never from here.
"""

from queue_app.services.drafts import (
    DRAFT_FIELDS as DRAFT_FIELDS,
)
from queue_app.services.drafts import (
    MAX_DRAFTS_PER_REQUEST as MAX_DRAFTS_PER_REQUEST,
)
from queue_app.services.drafts import (
    MAX_PROMPT_CHARS as MAX_PROMPT_CHARS,
)
from queue_app.services.drafts import (
    draft_default_model as draft_default_model,
)
from queue_app.services.drafts import (
    draft_provider_check as draft_provider_check,
)
from queue_app.services.drafts import (
    draft_update as draft_update,
)
from queue_app.services.drafts import (
    draft_values as draft_values,
)
from queue_app.services.drafts import (
    drafts_delete as drafts_delete,
)
from queue_app.services.drafts import (
    drafts_duplicate as drafts_duplicate,
)
from queue_app.services.drafts import (
    jobs_create_drafts as jobs_create_drafts,
)
from queue_app.services.errors import (
    ServiceError as ServiceError,
)
from queue_app.services.errors import (
    refuse_unknown as refuse_unknown,
)
from queue_app.services.errors import (
    within_limits as within_limits,
)
from queue_app.services.idempotency import (
    IDEMPOTENCY_TTL as IDEMPOTENCY_TTL,
)
from queue_app.services.idempotency import (
    IdempotencyConflict as IdempotencyConflict,
)
from queue_app.services.idempotency import (
    idempotent as idempotent,
)
from queue_app.services.idempotency import (
    request_fingerprint as request_fingerprint,
)
from queue_app.services.jobs import (
    _held as _held,
)
from queue_app.services.jobs import (
    attention_mark_failed as attention_mark_failed,
)
from queue_app.services.jobs import (
    attention_resubmit as attention_resubmit,
)
from queue_app.services.jobs import (
    failed_jobs_clear as failed_jobs_clear,
)
from queue_app.services.jobs import (
    failed_jobs_retry as failed_jobs_retry,
)
from queue_app.services.jobs import (
    failed_scope as failed_scope,
)
from queue_app.services.jobs import (
    jobs_cancel as jobs_cancel,
)
from queue_app.services.jobs import (
    jobs_retry as jobs_retry,
)
from queue_app.services.jobs import (
    jobs_start as jobs_start,
)
from queue_app.services.jobs import (
    selected_failed_clear as selected_failed_clear,
)
from queue_app.services.jobs import (
    selected_failed_retry as selected_failed_retry,
)
from queue_app.services.projects import (
    PROJECT_FIELDS as PROJECT_FIELDS,
)
from queue_app.services.projects import (
    PROJECT_TEXT_FIELDS as PROJECT_TEXT_FIELDS,
)
from queue_app.services.projects import (
    _whole as _whole,
)
from queue_app.services.projects import (
    project_create as project_create,
)
from queue_app.services.projects import (
    project_delete as project_delete,
)
from queue_app.services.projects import (
    project_set_archived as project_set_archived,
)
from queue_app.services.projects import (
    project_update as project_update,
)
from queue_app.services.projects import (
    project_values as project_values,
)
from queue_app.services.providers import (
    PROVIDER_FIELDS as PROVIDER_FIELDS,
)
from queue_app.services.providers import (
    _own_provider as _own_provider,
)
from queue_app.services.providers import (
    aliases_checked as aliases_checked,
)
from queue_app.services.providers import (
    base_url_checked as base_url_checked,
)
from queue_app.services.providers import (
    concurrency_checked as concurrency_checked,
)
from queue_app.services.providers import (
    provider_clear_cooldown as provider_clear_cooldown,
)
from queue_app.services.providers import (
    provider_delete as provider_delete,
)
from queue_app.services.providers import (
    provider_may_change as provider_may_change,
)
from queue_app.services.providers import (
    provider_save as provider_save,
)
from queue_app.services.providers import (
    provider_set_concurrency as provider_set_concurrency,
)
from queue_app.services.providers import (
    provider_set_paused as provider_set_paused,
)
from queue_app.services.providers import (
    provider_values as provider_values,
)
from queue_app.services.providers import (
    provider_work as provider_work,
)
from queue_app.services.storage import (
    MIB as MIB,
)
from queue_app.services.storage import (
    _delete_files as _delete_files,
)
from queue_app.services.storage import (
    album_item_delete as album_item_delete,
)
from queue_app.services.storage import (
    media_extension as media_extension,
)
from queue_app.services.storage import (
    reference_store as reference_store,
)
from queue_app.services.storage import (
    storage_check as storage_check,
)
