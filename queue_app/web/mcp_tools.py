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

from django.core.serializers.json import DjangoJSONEncoder

from queue_app.selectors import queue as queue_reads
from queue_app.selectors.agents import job_summary, project_detail, projects_after, providers_after
from queue_app.selectors.job_list import jobs_after
from queue_app.selectors.visibility import provider_visible
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_start
from queue_app.web import agent_schemas, album_api, api, api_manage, cursors, mcp_batches, mcp_manage, schemas
from queue_app.web.mcp_kit import READ, STARTS_WORK, Context, Tool, once

MAX_INLINE_IMAGES = 4
MAX_INLINE_IMAGE_BYTES = 1024 * 1024


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


def create_drafts(ctx: Context, args) -> dict:
    project = api.actable_project(ctx.user, args.project_id)
    return once(
        ctx, args, scope=f"drafts:{project.id}", run=lambda: api.drafts_create(ctx.user, project, args), exclude=("project_id",)
    )


def estimate_start(ctx: Context, args) -> dict:
    return api_manage.estimate_for(api.visible_project(ctx.user, args.project_id), args)


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


def run_next_jobs(ctx: Context, args) -> dict:
    return api.jobs_run_next(ctx.user, [str(job_id) for job_id in args.job_ids])


def clear_failed(ctx: Context, args) -> dict:
    return api.act_on_failed(ctx.user, args, action="clear")


def retry_failed(ctx: Context, args) -> dict:
    return api.act_on_failed(ctx.user, args, action="retry")


S, A = schemas, agent_schemas
DRAFTING = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": False}
CANCELS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": True}
# a repeat deletes jobs that failed meanwhile
CLEARS = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": False}
RUNS_NEXT = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
TOOLS = [
    Tool(
        "get_queue_status",
        "The Queue Monitor's totals.",
        A.QueueStatusArgs,
        A.QueueStatusOut,
        READ,
        queue_status,
    ),
    Tool("list_projects", "Your projects, oldest first.", A.ListArgs, A.ProjectPage, READ, list_projects),
    Tool(
        "get_project",
        "A project: kind, provider, default settings, jobs per status.",
        A.ProjectArgs,
        A.ProjectDetail,
        READ,
        get_project,
    ),
    Tool("list_providers", "Your provider records.", A.ListArgs, A.ProviderPage, READ, list_providers),
    Tool("get_provider", "One provider record.", A.ProviderArgs, A.ProviderOut, READ, get_provider),
    Tool(
        "list_jobs",
        "Jobs newest first, with why each waits.",
        A.ListJobsArgs,
        A.JobPage,
        READ,
        list_jobs,
    ),
    Tool(
        "get_job",
        "A job: state, error, settings, attempts, outputs (url: resources/read; download_url: 15 min, no token).",
        A.JobArgs,
        A.JobDetail,
        READ,
        get_job,
    ),
    Tool(
        "create_drafts",
        "Drafts of a prompt, free until started (project_options: what a project takes). The result says what they "
        "will run with (resolved, adjusted).",
        S.CreateDraftsArgs,
        S.DraftsCreated,
        DRAFTING,
        create_drafts,
        loose=("aspect_ratio", "quality", "resolution", "format", "background"),
    ),
    Tool(
        "estimate_start",
        "What starting drafts would cost per provider and currency; unknown prices counted apart. Starts nothing.",
        A.EstimateArgs,
        A.CostEstimate,
        READ,
        estimate_start,
    ),
    Tool(
        "start_jobs",
        "Queue jobs to run on the provider: may cost money.",
        S.StartJobsArgs,
        S.JobsStarted,
        STARTS_WORK,
        start_jobs,
    ),
    Tool("retry_jobs", "Queue chosen failed jobs again.", A.RetryJobsArgs, S.JobsRetried, STARTS_WORK, retry_jobs),
    Tool(
        "cancel_jobs",
        "Pending or processing jobs fail as cancelled.",
        A.CancelJobsArgs,
        S.JobsCancelled,
        CANCELS,
        cancel_jobs,
    ),
    Tool(
        "run_next_jobs",
        "Pending jobs to the front, first given first.",
        S.RunNextJobs,
        S.JobsRunNext,
        RUNS_NEXT,
        run_next_jobs,
    ),
    Tool(
        "retry_failed_jobs",
        "Queue every failed job of a scope again.",
        S.FailedScope,
        S.FailedResult,
        STARTS_WORK,
        retry_failed,
    ),
    Tool(
        "clear_failed_jobs",
        "Delete the failed jobs of a scope (outputs kept).",
        S.FailedScope,
        S.FailedResult,
        CLEARS,
        clear_failed,
    ),
    *mcp_manage.TOOLS,
    *mcp_batches.TOOLS,
]
BY_NAME = {tool.name: tool for tool in TOOLS}


def call(tool: Tool, ctx: Context, arguments: dict) -> dict:
    """Validate, run, and shape the result as its declared output (a mismatch is our bug
    and raises)."""
    args = schemas.validate(tool.arguments, arguments)
    result = tool.run(ctx, args)
    plain = json.loads(json.dumps(result, cls=DjangoJSONEncoder))
    return tool.result.model_validate(plain).model_dump(mode="json", exclude_unset=False)
