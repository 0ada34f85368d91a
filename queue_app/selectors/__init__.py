"""Every read: one module per entity, re-exported here so `selectors.queue_status(...)`
keeps working. Inside the package, modules import from their sibling, never from here.

The Queue Monitor, the JSON API, the MCP tools and `manage.py queue_status` all call
`queue_status` (queue.py). It runs a constant number of queries whatever the number of
jobs. Derived states (Waiting, Queued, Running, Stalled, Detached and the waiting reason)
are defined once, SQL beside Python, in queue_app/states.py; queue.py only applies them.
Ownership ("this user may see / change this row") is `visible_to` / `may_see` in
visibility.py. history.py, search.py and workers.py are imported as modules
(`from queue_app.selectors import history`).
"""

from queue_app.selectors.agents import (
    _project_row as _project_row,
)
from queue_app.selectors.agents import (
    job_summary as job_summary,
)
from queue_app.selectors.agents import (
    project_detail as project_detail,
)
from queue_app.selectors.agents import (
    projects_after as projects_after,
)
from queue_app.selectors.agents import (
    provider_json as provider_json,
)
from queue_app.selectors.agents import (
    providers_after as providers_after,
)
from queue_app.selectors.jobs import (
    ATTENTION_ROWS as ATTENTION_ROWS,
)
from queue_app.selectors.jobs import (
    LAYER_ROLES as LAYER_ROLES,
)
from queue_app.selectors.jobs import (
    SNAPSHOT_FIELDS as SNAPSHOT_FIELDS,
)
from queue_app.selectors.jobs import (
    album_counts as album_counts,
)
from queue_app.selectors.jobs import (
    album_grouped as album_grouped,
)
from queue_app.selectors.jobs import (
    album_zip_items as album_zip_items,
)
from queue_app.selectors.jobs import (
    attention_jobs as attention_jobs,
)
from queue_app.selectors.jobs import (
    job_detail as job_detail,
)
from queue_app.selectors.jobs import (
    jobs_by_status as jobs_by_status,
)
from queue_app.selectors.projects import (
    PROJECT_CHOICES_LIMIT as PROJECT_CHOICES_LIMIT,
)
from queue_app.selectors.projects import (
    album_images as album_images,
)
from queue_app.selectors.projects import (
    draft_providers as draft_providers,
)
from queue_app.selectors.projects import (
    own_projects as own_projects,
)
from queue_app.selectors.projects import (
    project_choices as project_choices,
)
from queue_app.selectors.projects import (
    project_drafts as project_drafts,
)
from queue_app.selectors.projects import (
    project_footprint as project_footprint,
)
from queue_app.selectors.projects import (
    project_json as project_json,
)
from queue_app.selectors.projects import (
    reference_of as reference_of,
)
from queue_app.selectors.projects import (
    storage_summary as storage_summary,
)
from queue_app.selectors.queue import (
    COUNT_KEYS as COUNT_KEYS,
)
from queue_app.selectors.queue import (
    JOB_FILTER_STATES as JOB_FILTER_STATES,
)
from queue_app.selectors.queue import (
    MAX_PER_PAGE as MAX_PER_PAGE,
)
from queue_app.selectors.queue import (
    _empty_counts as _empty_counts,
)
from queue_app.selectors.queue import (
    _flag as _flag,
)
from queue_app.selectors.queue import (
    _limited as _limited,
)
from queue_app.selectors.queue import (
    _provider_warning as _provider_warning,
)
from queue_app.selectors.queue import (
    _ts as _ts,
)
from queue_app.selectors.queue import (
    _warnings as _warnings,
)
from queue_app.selectors.queue import (
    job_row as job_row,
)
from queue_app.selectors.queue import (
    job_state as job_state,
)
from queue_app.selectors.queue import (
    jobs_page as jobs_page,
)
from queue_app.selectors.queue import (
    queue_status as queue_status,
)
from queue_app.selectors.queue import (
    runner_health as runner_health,
)
from queue_app.selectors.queue import (
    waiting_reason as waiting_reason,
)
from queue_app.selectors.visibility import (
    may_see as may_see,
)
from queue_app.selectors.visibility import (
    provider_visible as provider_visible,
)
from queue_app.selectors.visibility import (
    visible_jobs as visible_jobs,
)
from queue_app.selectors.visibility import (
    visible_projects as visible_projects,
)
from queue_app.selectors.visibility import (
    visible_providers as visible_providers,
)
from queue_app.selectors.visibility import (
    visible_to as visible_to,
)
