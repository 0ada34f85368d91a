"""The MCP tools: what a person does from the pages, for an agent (issue 17).

Each tool is one row of TOOLS: its arguments and its result are pydantic models from
`queue_app.web.schemas` (the same models the JSON API validates with) and
`queue_app.web.agent_schemas` (lists and lookups), so inputSchema and outputSchema are
generated, never written by hand. A handler gets the validated arguments and calls one
selector or service, like an API view.

Lists page with an opaque cursor (`nextCursor` → `cursor`), always by key (web/cursors.py):
projects and providers by id, jobs by (created_at, id) newest first.
"""

import base64
import json
from dataclasses import dataclass, field

from django.core.serializers.json import DjangoJSONEncoder
from pydantic import BaseModel

from queue_app.selectors import queue as queue_reads
from queue_app.selectors.agents import job_summary, project_detail, projects_after, providers_after
from queue_app.selectors.job_list import jobs_after
from queue_app.selectors.visibility import provider_visible
from queue_app.services.errors import ServiceError
from queue_app.services.idempotency import idempotent
from queue_app.services.jobs import jobs_start
from queue_app.web import agent_schemas, album_api, api, cursors, schemas

READ = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
# Starting work calls provider APIs (the open world) and may spend money.
STARTS_WORK = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": True}
MAX_INLINE_IMAGES = 4
MAX_INLINE_IMAGE_BYTES = 1024 * 1024


@dataclass
class Context:
    user: object
    base_url: str  # scheme://host of the request, for output links
    extra_content: list = field(default_factory=list)  # content items beside the JSON text


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    arguments: type[BaseModel]
    result: type[BaseModel]
    annotations: dict
    run: object  # (Context, arguments) -> dict

    def describe(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": json_schema(self.arguments),
            "outputSchema": json_schema(self.result),
            "annotations": {"title": self.title, **self.annotations},
        }


def json_schema(model: type[BaseModel]) -> dict:
    schema = model.model_json_schema()
    schema.setdefault("type", "object")
    return schema


# --- pages -----------------------------------------------------------------------------


def page(rows_key: str, result: dict) -> dict:
    after = result.pop("next_after")
    return {rows_key: result[rows_key], **({"nextCursor": cursors.id_cursor(after)} if after is not None else {})}


# --- handlers ---------------------------------------------------------------------------


def queue_status(ctx: Context, args) -> dict:
    return queue_reads.queue_status(user=ctx.user, breakdown=args.breakdown, limit=args.limit)


def list_projects(ctx: Context, args) -> dict:
    return page("projects", projects_after(user=ctx.user, after_id=cursors.after_id(args.cursor), limit=args.limit))


def get_project(ctx: Context, args) -> dict:
    project = project_detail(user=ctx.user, project_id=args.project_id)
    if project is None:
        raise ServiceError("project not found", 404, field="project_id")
    return project


def list_providers(ctx: Context, args) -> dict:
    return page("providers", providers_after(user=ctx.user, after_id=cursors.after_id(args.cursor), limit=args.limit))


def get_provider(ctx: Context, args) -> dict:
    found = providers_after(user=ctx.user, after_id=args.provider_id - 1, limit=1)["providers"]
    if not found or found[0]["id"] != args.provider_id:
        raise ServiceError("provider not found", 404, field="provider_id")
    return found[0]


def list_jobs(ctx: Context, args) -> dict:
    if args.project_id is not None:
        api.visible_project(ctx.user, args.project_id)
    if args.provider_id is not None and provider_visible(ctx.user, args.provider_id) is None:
        raise ServiceError("provider not found", 404, field="provider_id")
    result = jobs_after(
        user=ctx.user,
        state=args.status,
        project_id=args.project_id,
        provider_id=args.provider_id,
        after=cursors.after_time(args.cursor),
        limit=args.limit,
    )
    after = result.pop("next_after")
    return {**result, **({"nextCursor": cursors.time_cursor(*after)} if after else {})}


def get_job(ctx: Context, args) -> dict:
    from queue_app.models import AlbumItem

    job = job_summary(user=ctx.user, job_id=args.job_id)
    if job is None:
        raise ServiceError("job not found", 404, field="job_id")
    inlined = 0
    job["outputs"] = [album_api.with_links(ctx.base_url, ctx.user, output) for output in job["outputs"]]
    for output in job["outputs"]:
        if output["url"] and output["kind"] != "text":
            ctx.extra_content.append(
                {
                    "type": "resource_link",
                    "uri": output["url"],
                    "name": f"output {output['index']} of job {job['id'][:8]}",
                    "mimeType": output["content_type"] or "application/octet-stream",
                    "size": output["size"],
                }
            )
        wants_image = args.include_images and output["kind"] == "image" and inlined < MAX_INLINE_IMAGES
        if (
            wants_image
            and output["url"]
            and output["size"] <= MAX_INLINE_IMAGE_BYTES
            and output["content_type"].startswith("image/")
        ):
            item = AlbumItem.objects.get(id=output["id"])
            with item.file.open("rb") as handle:
                data = handle.read(MAX_INLINE_IMAGE_BYTES + 1)
            if len(data) <= MAX_INLINE_IMAGE_BYTES:
                ctx.extra_content.append(
                    {"type": "image", "data": base64.b64encode(data).decode(), "mimeType": output["content_type"]}
                )
                inlined += 1
    return job


def once(ctx: Context, args, *, scope: str, run, exclude=()) -> dict:
    """`run()` (payload, status) done once per idempotency key: the same key with the same
    arguments replays the first payload. The fingerprint is the arguments as the REST body
    they mirror (`exclude`: the ones the REST call carries in its path or not at all)."""
    body = args.model_dump(mode="json", exclude_none=True, exclude_defaults=True, exclude={"idempotency_key", *exclude})
    payload, _ = idempotent(user=ctx.user, key=args.idempotency_key, scope=scope, body=body, run=run)
    return payload


def create_drafts(ctx: Context, args) -> dict:
    project = api.actable_project(ctx.user, args.project_id)
    return once(
        ctx, args, scope=f"drafts:{project.id}", run=lambda: api.drafts_create(ctx.user, project, args), exclude=("project_id",)
    )


def start_jobs(ctx: Context, args) -> dict:
    project = api.actable_project(ctx.user, args.project_id)

    def run():
        return jobs_start(user=project.owner, project=project, job_ids=args.ids(), all_drafts=args.all_drafts), 200

    return once(ctx, args, scope=f"start:{project.id}", run=run, exclude=("project_id", "wait", "wait_seconds"))


def retry_jobs(ctx: Context, args) -> dict:
    return once(ctx, args, scope="retry", run=lambda: (api.jobs_retry(ctx.user, args), 200))


def cancel_jobs(ctx: Context, args) -> dict:
    job_ids = [str(job_id) for job_id in args.job_ids]
    return once(ctx, args, scope="cancel", run=lambda: (api.jobs_cancel(ctx.user, job_ids), 200))


def clear_failed(ctx: Context, args) -> dict:
    return api.act_on_failed(ctx.user, args, action="clear")


def retry_failed(ctx: Context, args) -> dict:
    return api.act_on_failed(ctx.user, args, action="retry")


def pause_provider(ctx: Context, args) -> dict:
    return api.provider_update(ctx.user, args.provider_id, schemas.ProviderUpdate(paused=True))


def resume_provider(ctx: Context, args) -> dict:
    return api.provider_update(ctx.user, args.provider_id, schemas.ProviderUpdate(paused=False))


def set_concurrency(ctx: Context, args) -> dict:
    return api.provider_update(ctx.user, args.provider_id, schemas.ProviderUpdate(concurrency=args.concurrency))


S, A = schemas, agent_schemas
TOOLS = [
    Tool(
        "get_queue_status",
        "Queue status",
        "Totals of the generation queue (pending, processing, failed; queued, waiting, running, stalled, detached; "
        "active slots vs concurrency; the oldest dispatchable job's age), optionally per project or provider. "
        "The same counts as the Queue Monitor.",
        A.QueueStatusArgs,
        A.QueueStatusOut,
        READ,
        queue_status,
    ),
    Tool(
        "list_projects",
        "List projects",
        "Your projects (idle ones too), oldest first, one page at a time.",
        A.ListArgs,
        A.ProjectPage,
        READ,
        list_projects,
    ),
    Tool(
        "get_project",
        "Get a project",
        "One project: its kind, provider, default output settings, and its job counts per status.",
        A.ProjectArgs,
        A.ProjectDetail,
        READ,
        get_project,
    ),
    Tool(
        "list_providers",
        "List providers",
        "Your provider records: family, paused or cooling down, concurrency and the slots in use.",
        A.ListArgs,
        A.ProviderPage,
        READ,
        list_providers,
    ),
    Tool("get_provider", "Get a provider", "One provider record.", A.ProviderArgs, A.ProviderOut, READ, get_provider),
    Tool(
        "list_jobs",
        "List jobs",
        "Jobs newest first, in one project or provider queue or everywhere, filtered by state, with why each waits.",
        A.ListJobsArgs,
        A.JobPage,
        READ,
        list_jobs,
    ),
    Tool(
        "get_job",
        "Get a job",
        "One job: status and derived state, error, the resolved settings it ran with, every attempt, and its outputs "
        "(links, text outputs inline; images inline with include_images).",
        A.JobArgs,
        A.JobDetail,
        READ,
        get_job,
    ),
    Tool(
        "create_drafts",
        "Create drafts",
        "Create `quantity` drafts of one prompt in a project, with optional output settings. Drafts cost nothing until "
        "started. The result says what they will run with (`resolved`) and which requested values the model changed "
        "(`adjusted`). Pass idempotency_key to retry safely.",
        S.CreateDraftsArgs,
        S.DraftsCreated,
        {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": False},
        create_drafts,
    ),
    Tool(
        "start_jobs",
        "Start jobs",
        "Start selected drafts or failed jobs (job_ids) or every draft of a project (all_drafts: true): they are queued "
        "and run on the provider, which may cost money. Starting a job twice is harmless.",
        S.StartJobsArgs,
        S.JobsStarted,
        STARTS_WORK,
        start_jobs,
    ),
    Tool(
        "retry_jobs",
        "Retry jobs",
        "Put chosen failed jobs back in the queue (other jobs are skipped). A job that keeps its remote task is "
        "collected, not paid for again.",
        A.RetryJobsArgs,
        S.JobsRetried,
        STARTS_WORK,
        retry_jobs,
    ),
    Tool(
        "cancel_jobs",
        "Cancel jobs",
        'Cancel pending or processing jobs (job_ids): each fails at once with reason "cancelled"; a running call\'s '
        "result is discarded and a remote task is cancelled at the provider where its API can. Drafts and finished "
        "jobs are skipped. Cancelled jobs can be retried or cleared like failed ones.",
        A.CancelJobsArgs,
        S.JobsCancelled,
        {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": True},
        cancel_jobs,
    ),
    Tool(
        "retry_failed_jobs",
        "Retry failed jobs",
        "Put every failed job in one scope (all, a project or a provider queue) back in the queue.",
        S.FailedScope,
        S.FailedResult,
        STARTS_WORK,
        retry_failed,
    ),
    Tool(
        "clear_failed_jobs",
        "Clear failed jobs",
        "Delete failed job records in one scope: everything you may see, a project, or a provider queue "
        "(project_id and provider_id are mutually exclusive). Album outputs are kept. dry_run counts only.",
        S.FailedScope,
        S.FailedResult,
        {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": False},
        clear_failed,
    ),
    Tool(
        "pause_provider",
        "Pause a provider",
        "Stop dispatching new jobs to a provider record; running work finishes.",
        A.ProviderArgs,
        S.ProviderRow,
        {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False},
        pause_provider,
    ),
    Tool(
        "resume_provider",
        "Resume a provider",
        "Dispatch to a paused provider record again (its queued jobs start at once).",
        A.ProviderArgs,
        S.ProviderRow,
        STARTS_WORK,
        resume_provider,
    ),
    Tool(
        "set_concurrency",
        "Set a provider's concurrency",
        "How many jobs a provider record runs at once. Raising it starts queued work at once; lowering it never "
        "cancels running work.",
        A.SetConcurrencyArgs,
        S.ProviderRow,
        STARTS_WORK,
        set_concurrency,
    ),
]
BY_NAME = {tool.name: tool for tool in TOOLS}


def call(tool: Tool, ctx: Context, arguments: dict) -> dict:
    """Validate, run, and shape the result as its declared output (a mismatch is our bug
    and raises)."""
    args = schemas.validate(tool.arguments, arguments)
    result = tool.run(ctx, args)
    plain = json.loads(json.dumps(result, cls=DjangoJSONEncoder))
    return tool.result.model_validate(plain).model_dump(mode="json", exclude_unset=False)
