"""The project page's "Generate drafts" (issue 29): the workflow as lines of text, one
item a line (`prompt: a {red|blue} fox`, `reference: album:12`, `aspect_ratio: 16:9`; a
leading `#` disables one), a preview of the count and the first drafts, then the drafts.
And the account's wildcard lists. Thin: parse, call services.combinations, render."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from queue_app.models import Project
from queue_app.selectors.batches import prompt_templates, recent_prompts, wildcard_lists, workflow_items
from queue_app.services.combinations import ITEM_TYPES, drafts_generate
from queue_app.services.errors import ServiceError
from queue_app.services.wildcards import wildcard_list_delete, wildcard_list_save
from queue_app.web.shortcuts import own_to_act

EXAMPLE = (
    "prompt: a {red|blue} fox in the snow\nprompt: an owl at night\nreference: https://…\naspect_ratio: 1:1\naspect_ratio: 16:9"
)


def items_of(text: str) -> list[dict]:
    """The workflow lines as items, or a ServiceError naming the first bad line."""
    items = []
    for number, line in enumerate((text or "").splitlines(), start=1):
        line = line.strip()
        enabled = not line.startswith("#")
        line = line.lstrip("#").strip()
        if not line:
            continue
        kind, colon, value = line.partition(":")
        kind = kind.strip().lower().replace(" ", "_")
        if not colon or kind not in ITEM_TYPES:
            raise ServiceError(f"line {number}: write “type: value”, the type one of {', '.join(ITEM_TYPES)}")
        value = value.strip()
        items.append(
            {"type": kind, "value": int(value) if kind in ("duration", "seed") and value.isdigit() else value, "enabled": enabled}
        )
    return items


def lines_of(items: list[dict]) -> str:
    return "\n".join(f"{'' if item['enabled'] else '# '}{item['type']}: {item['value']}" for item in items)


def number_or_none(value: str, name: str):
    value = (value or "").strip()
    if not value:
        return None
    if not value.isdigit() or len(value) > 12:
        raise ServiceError(f"{name} must be a whole number")
    return int(value)


@login_required
def generate_drafts(request, project_id: int):
    project = own_to_act(Project, request.user, id=project_id)
    form = {"workflow": lines_of(workflow_items(project)), "quantity": "", "mode": "ordered", "seed": "", "on_too_long": "cancel"}
    preview, error = None, None
    if request.method == "POST":
        form.update({key: request.POST.get(key) or form[key] for key in form if key != "workflow"})
        form["workflow"] = request.POST.get("workflow", "")
        try:
            preview = drafts_generate(
                user=project.owner,
                project=project,
                items=items_of(form["workflow"]),
                quantity=number_or_none(form["quantity"], "quantity"),
                mode=form["mode"],
                seed=number_or_none(form["seed"], "seed"),
                on_too_long=form["on_too_long"],
                save=True,
                create=request.POST.get("action") == "create",
            )
        except ServiceError as refusal:
            error = refusal.message
        if preview and preview["job_ids"]:
            messages.success(request, f"{len(preview['job_ids'])} drafts created from {preview['combinations']} combinations.")
            return redirect("project_detail", project.id)
        if preview and preview["seed"] is not None:
            form["seed"] = str(preview["seed"])  # shown, so "Create" makes the batch previewed
    context = {"project": project, "form": form, "preview": preview, "error": error, "example": EXAMPLE, "types": ITEM_TYPES}
    context.update(recent=recent_prompts(project), templates=sorted(prompt_templates(request.user).items()))
    return render(request, "queue_app/generate.html", context, status=400 if error else 200)


@login_required
def wildcards(request):
    if request.method == "POST":
        try:
            row = wildcard_list_save(user=request.user, name=request.POST.get("name", ""), values=request.POST.get("values", ""))
            messages.success(request, f"Saved __{row.name}__ ({len(row.values)} values).")
            return redirect("wildcards")
        except ServiceError as refusal:
            messages.error(request, refusal.message)
    return render(request, "queue_app/wildcards.html", {"lists": sorted(wildcard_lists(request.user).items())})


@login_required
@require_POST
def wildcard_delete(request, name: str):
    wildcard_list_delete(user=request.user, name=name)
    return redirect("wildcards")
