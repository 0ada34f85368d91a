"""The MCP tool of the combinations generator (issue 29): the same service as `POST
/api/projects/<id>/generate`, on the project's stored workflow. Its rows join
`mcp_tools.TOOLS`."""

from queue_app.services.combinations import drafts_generate
from queue_app.web import api
from queue_app.web import batch_schemas as B
from queue_app.web.mcp_kit import CREATES, Context, Tool, once


def generate(project, args) -> dict:
    options = args.model_dump(include={"quantity", "seed", "create"})
    options["on_too_long"] = args.on_too_long or "cancel"
    mode = "ordered" if args.seed is None else "random"
    return {"project_id": project.id, **drafts_generate(user=project.owner, project=project, mode=mode, **options)}


def generate_drafts(ctx: Context, args) -> dict:
    project = api.actable_project(ctx.user, args.project_id)
    if not args.create:
        return generate(project, args)
    return once(ctx, args, scope=f"generate:{project.id}", run=lambda: (generate(project, args), 200), exclude=("project_id",))


TOOLS = [
    Tool(
        "generate_drafts",
        "Count, preview or (create: true) make the project's workflow drafts.",
        B.GenerateDraftsArgs,
        B.DraftsGeneratedBrief,
        CREATES,
        generate_drafts,
        terse=("project_id", "quantity", "on_too_long", "create", "idempotency_key"),
    ),
]
