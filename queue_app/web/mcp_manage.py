"""MCP tools to start from nothing and keep things tidy (issue 32): projects and provider
records (a key can be set, never read back), one draft, the album, and what a project's
drafts may set. Each calls the function its JSON API route calls, with the same schema."""

from queue_app.selectors.agents import provider_json
from queue_app.selectors.projects import project_json
from queue_app.services.errors import ServiceError
from queue_app.services.projects import project_create
from queue_app.services.providers import provider_delete, provider_save
from queue_app.services.storage import album_item_delete
from queue_app.web import agent_schemas as A
from queue_app.web import album_api, api, api_drafts, api_manage, manage_schemas, schemas
from queue_app.web.mcp_kit import CHANGES, CREATES, DELETES, READ, Context, Tool, once
from queue_app.web.schemas import MAX_ID

DRAFT_ENUMS = ("aspect_ratio", "quality", "resolution", "format", "background")


def changes(args, *exclude) -> dict:
    """The fields an agent sent (an explicit null included: "provider_id": null clears)."""
    return args.model_dump(mode="json", exclude_unset=True, exclude={"idempotency_key", *exclude})


def save_project(ctx: Context, args) -> dict:
    if args.project_id is None:
        data = changes(args, "project_id")
        schemas.validate(manage_schemas.ProjectCreate, data)  # a name, and no archived
        run = lambda: (project_json(project_create(user=ctx.user, data=data)), 201)  # noqa: E731
        return once(ctx, args, scope="projects:create", run=run)
    project = api.visible_project(ctx.user, args.project_id)
    data = changes(args, "project_id")
    if not data:
        raise ServiceError("give the fields to change")
    return project_json(api_manage.project_change(ctx.user, project, data))


def save_provider(ctx: Context, args) -> dict:
    data = changes(args, "provider_id")
    if args.provider_id is None:
        schemas.validate(manage_schemas.ProviderCreate, data)  # a name and a family
        run = lambda: (provider_json(provider_save(user=ctx.user, data=data)), 201)  # noqa: E731
        # the key is never part of the fingerprint kept for replays
        return once(ctx, args, scope="providers:create", run=run, exclude=("api_key", "api_secret", "provider_id"))
    provider = api_manage.visible_provider(ctx.user, args.provider_id)
    if not data:
        raise ServiceError("give the fields to change")
    return provider_json(provider_save(user=ctx.user, provider=provider, data=data))


def update_draft(ctx: Context, args) -> dict:
    return api_drafts.draft_change(ctx.user, args.job_id, changes(args, "job_id"))


def delete(ctx: Context, args) -> dict:
    """Delete one project (its jobs and album; refused while jobs run), provider record
    (refused while it has work), draft or album item (its file; storage freed)."""
    kind, row_id = args.kind, args.id
    if isinstance(row_id, int) == (kind == "draft") or (isinstance(row_id, int) and not 1 <= row_id <= MAX_ID):
        raise ServiceError(f"{kind} not found", 404, field="id")
    if kind == "project":
        return api_manage.project_remove(ctx.user, api.visible_project(ctx.user, row_id))
    if kind == "provider":
        return provider_delete(user=ctx.user, provider_id=api_manage.visible_provider(ctx.user, row_id).id)
    if kind == "draft":
        return api_drafts.draft_remove(ctx.user, row_id)
    return {"deleted": True, "freed": album_item_delete(user=ctx.user, item_id=row_id)}


def list_album(ctx: Context, args) -> dict:
    return album_api.album_page(ctx.user, ctx.base_url, project_id=args.project_id, cursor=args.cursor, limit=args.limit)


def project_options(ctx: Context, args) -> dict:
    from queue_app.models import Provider
    from queue_app.web.drafts import model_choices, option_lists

    project = api.visible_project(ctx.user, args.project_id)
    provider = None
    if args.provider_id is not None:
        provider = Provider.objects.filter(id=args.provider_id, owner=project.owner).first()
        if provider is None:
            raise ServiceError("provider not found", 404, field="provider_id")
    effective = provider or project.provider
    models = [value for value, _ in model_choices(project, provider)]
    model = args.model or (project.model if provider is None and project.model else (models[0] if models else ""))
    offered = {name: values for name, values in option_lists(project, provider, model).items() if values}
    detail = project_json(project)
    return {
        "project_id": project.id,
        "kind": project.kind,
        "provider_id": effective.id if effective else None,
        "family": effective.family if effective else "",
        "model": model,
        "models": models,
        "options": offered,
        "defaults": detail["defaults"],
        "comfyui_inputs": comfyui_inputs(project),
    }


def comfyui_inputs(project) -> list[dict] | None:
    """The bound inputs of a ComfyUI project's workflow (what a draft's prompt, params.<name>
    and references fill), or None for other kinds."""
    from django.core.exceptions import ObjectDoesNotExist

    try:
        instance = project.comfy
    except ObjectDoesNotExist:
        return None
    fields = ("source", "node", "input", "kind")
    return [{name: binding.get(name) for name in fields} for binding in instance.bindings or []]


TOOLS = [
    Tool(
        "project_options",
        "A project's models, each setting's values for one model, a ComfyUI workflow's bound inputs.",
        A.ProjectOptionsArgs,
        A.ProjectOptions,
        READ,
        project_options,
    ),
    Tool(
        "save_project",
        "Without project_id: a new project; with it: change the fields given.",
        A.SaveProjectArgs,
        A.ProjectOut,
        CREATES,
        save_project,
    ),
    Tool(
        "save_provider",
        "Without provider_id: a new record; with it: change the fields given. The key is never returned.",
        A.SaveProviderArgs,
        A.ProviderRecord,
        {**CREATES, "openWorldHint": True},  # resuming or raising concurrency starts queued work
        save_provider,
    ),
    Tool(
        "update_draft",
        "Change the fields given.",
        A.UpdateDraftArgs,
        A.DraftOut,
        CHANGES,
        update_draft,
        loose=DRAFT_ENUMS,
        terse=("model", *DRAFT_ENUMS, "sound", "duration", "params", "references"),
    ),
    Tool(
        "list_album",
        "Outputs newest first (url, download_url as in get_job).",
        A.ListAlbumArgs,
        A.AlbumPage,
        READ,
        list_album,
    ),
    Tool(
        "delete",
        "A project (its jobs, album), a provider without work, a draft, an album item.",
        A.DeleteArgs,
        A.Deleted,
        DELETES,
        delete,
    ),
]
