"""JSON API of the combinations generator and the wildcard lists (issue 29).

`POST /api/projects/<id>/generate` counts and previews a workflow's drafts and, with
`create: true`, makes them (an Idempotency-Key makes a retry safe); `GET
/api/projects/<id>/workflow` is the stored workflow. `GET /api/wildcards` lists the
account's named lists, `POST` saves one, `DELETE /api/wildcards/<name>` removes it.
Reuse: `POST /api/projects/<id>/reuse` (jobs or album items again, with a change), `GET
/api/projects/<id>/prompts` (recent prompts), `/api/templates` (saved prompts) like the lists.
"""

from queue_app.models import AlbumItem, Provider
from queue_app.selectors.batches import prompt_templates, recent_prompts, wildcard_lists, workflow_items
from queue_app.services.combinations import drafts_generate
from queue_app.services.errors import ServiceError
from queue_app.services.idempotency import idempotent
from queue_app.services.reuse import jobs_reuse, prompt_template_delete, prompt_template_save
from queue_app.services.wildcards import wildcard_list_delete, wildcard_list_save
from queue_app.web import batch_schemas, schemas
from queue_app.web.api import actable_project, answer, endpoint, visible_project


def generate(user, project, args: batch_schemas.GenerateDrafts) -> dict:
    workflow = None if args.workflow is None else [item.model_dump() for item in args.workflow]
    result = drafts_generate(
        user=project.owner,
        project=project,
        items=workflow,
        quantity=args.quantity,
        mode=args.mode,
        seed=args.seed,
        on_too_long=args.on_too_long,
        save=args.save,
        create=args.create,
    )
    return {"project_id": project.id, **result}


@endpoint("POST")
def generate_view(request, body, project_id):
    project = actable_project(request.user, project_id)
    args = schemas.validate(batch_schemas.GenerateDrafts, body)
    if not args.create:
        return answer(generate(request.user, project, args))
    payload, code = idempotent(
        user=request.user,
        key=request.headers.get("Idempotency-Key"),
        scope=f"generate:{project.id}",
        body=body,
        run=lambda: (generate(request.user, project, args), 200),
    )
    return answer(payload, code)


@endpoint("GET")
def workflow_view(request, body, project_id):
    project = visible_project(request.user, project_id)
    return answer({"project_id": project.id, "items": workflow_items(project)})


@endpoint("GET", "POST")
def wildcards_view(request, body):
    if request.method == "POST":
        args = schemas.validate(batch_schemas.WildcardListIn, body)
        row = wildcard_list_save(user=request.user, name=args.name, values=args.values)
        return answer({"name": row.name, "values": row.values})
    lists = wildcard_lists(request.user)
    return answer({"lists": [{"name": name, "values": values} for name, values in sorted(lists.items())]})


@endpoint("DELETE")
def wildcard_view(request, body, name):
    if not wildcard_list_delete(user=request.user, name=name):
        raise ServiceError("wildcard list not found", 404, field="name")
    return answer({"deleted": 1})


@endpoint("POST")
def reuse_view(request, body, project_id):
    """New drafts from jobs or album items of the project, with a change."""
    project = actable_project(request.user, project_id)
    args = schemas.validate(batch_schemas.ReuseJobs, body)
    job_ids = [str(job_id) for job_id in args.job_ids or []]
    if args.album_item_ids:
        items = AlbumItem.objects.filter(project=project, id__in=args.album_item_ids).exclude(job=None)
        job_ids += [str(job_id) for job_id in items.values_list("job_id", flat=True)]
    wanted = [args.provider_id] if args.provider_id is not None else []
    wanted += list(dict.fromkeys(args.provider_ids or []))
    found = {row.id: row for row in Provider.objects.filter(id__in=wanted, owner=project.owner)}
    if any(provider_id not in found for provider_id in wanted):
        raise ServiceError("provider not found", 404, field="provider_ids" if args.provider_ids else "provider_id")
    jobs = jobs_reuse(
        user=project.owner,
        project=project,
        job_ids=list(dict.fromkeys(job_ids)),
        prompt=args.prompt,
        providers=[found[provider_id] for provider_id in dict.fromkeys(wanted)],
        settings_=args.settings,
    )
    return answer({"project_id": project.id, "job_ids": [str(job.id) for job in jobs]}, 201)


@endpoint("GET")
def prompts_view(request, body, project_id):
    project = visible_project(request.user, project_id)
    return answer({"project_id": project.id, "prompts": recent_prompts(project)})


@endpoint("GET", "POST")
def templates_view(request, body):
    if request.method == "POST":
        args = schemas.validate(batch_schemas.PromptTemplateIn, body)
        row = prompt_template_save(user=request.user, name=args.name, text=args.text)
        return answer({"name": row.name, "text": row.text})
    rows = sorted(prompt_templates(request.user).items())
    return answer({"templates": [{"name": name, "text": text} for name, text in rows]})


@endpoint("DELETE")
def template_view(request, body, name):
    if not prompt_template_delete(user=request.user, name=name):
        raise ServiceError("template not found", 404, field="name")
    return answer({"deleted": 1})
