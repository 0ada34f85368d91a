"""The project page's drafts: add (one per line, with reference images), edit, duplicate,
delete, select all across pages, and the provider / model / settings fields that follow
the chosen provider and model without reloading the page (the `options` partial).

Thin like the other pages: parse, call a service, render. The reference checks are the
services' (`references.normalize`), the same ones the API runs.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from queue_app.models import Job, Kind, Project, Provider
from queue_app.providers.catalogue import CATALOGUE, model_spec
from queue_app.selectors.estimate import job_estimate
from queue_app.selectors.projects import album_images, draft_providers, project_drafts, reference_of
from queue_app.services import drafts as draft_writes
from queue_app.services import references
from queue_app.services.drafts import MAX_DRAFTS_PER_REQUEST, draft_update, jobs_create_drafts
from queue_app.services.errors import ServiceError
from queue_app.web import album_files
from queue_app.web.shortcuts import act_on_selected, back_to_project, is_uuid, own, own_to_act

PAGE_SIZE = 50
OPTION_NAMES = ("aspect_ratio", "quality", "resolution", "format", "background", "duration", "sound")
OPTION_LABELS = {"aspect_ratio": "Aspect ratio"}


# --- The fields that follow the provider and model ---------------------------------------


def chosen_provider(request_data, project: Project) -> Provider | None:
    """The draft's own provider from a form ("" or missing: the project's)."""
    value = (request_data.get("provider") or "").strip()
    if not value:
        return None
    if not value.isdigit() or len(value) > 18:
        raise ServiceError("provider not found", 404, field="provider_id")
    provider = Provider.objects.filter(id=int(value), owner=project.owner).first()
    if provider is None:
        raise ServiceError("provider not found", 404, field="provider_id")
    return provider


def model_choices(project: Project, provider: Provider | None) -> list[tuple[str, str]]:
    """The models the effective provider offers for the project's kind (its aliases too)."""
    effective = provider or project.provider
    if effective is None:
        return [(project.model, project.model)] if project.model else []
    choices = [(spec.id, spec.name) for spec in CATALOGUE.get(effective.family, {}).values() if spec.kind == project.kind]
    choices += [(alias, f"{alias} (alias)") for alias in (effective.model_aliases or {})]
    if provider is None and project.model and project.model not in [c[0] for c in choices]:
        choices.insert(0, (project.model, project.model))
    return choices


def option_lists(project: Project, provider: Provider | None, model: str) -> dict:
    """What a model offers for each output setting (an empty list: not offered)."""
    effective = provider or project.provider
    spec = model_spec(effective.family, model, effective.model_aliases) if effective else None
    return {
        "aspect_ratio": list(spec.aspect_ratios) if spec else [],
        "quality": list(spec.qualities) if spec else [],
        "resolution": list(spec.resolutions) if spec else [],
        "format": list(spec.formats) if spec else [],
        "background": list(spec.backgrounds) if spec else [],
        "duration": [str(d) for d in spec.durations] if spec else [],
        "sound": ["on", "off"] if (spec and spec.kind == Kind.VIDEO) else [],
    }


def fields_context(project: Project, data, *, job: Job | None = None) -> dict:
    """Provider, model and option selects, with what `data` (a form, a query) chose —
    or the draft's own values when editing."""
    current = (lambda name: str(getattr(job, name) or "")) if job is not None else (lambda name: "")
    try:
        provider = chosen_provider(data, project) if "provider" in data else (job.provider if job else None)
    except ServiceError:
        provider = None
    choices = model_choices(project, provider)
    values = [value for value, _ in choices]
    model = data.get("model") if "model" in data else current("model")
    if model not in values:
        model = (project.model if provider is None and project.model in values else "") or (values[0] if values else "")
    options = option_lists(project, provider, model)
    selected = {name: (data.get(name) if name in data else current(name)) or "" for name in OPTION_NAMES}
    return {
        "project": project,
        "draft_providers": [] if project.kind == Kind.COMFYUI else draft_providers(project.owner, project.kind),
        "chosen_provider": provider.id if provider else "",
        "models": choices,
        "chosen_model": model,
        "option_fields": [
            {"name": name, "label": OPTION_LABELS.get(name, name.capitalize()), "values": values_, "selected": selected[name]}
            for name, values_ in options.items()
            if values_
        ],
    }


def form_settings(project: Project, provider: Provider | None, data) -> dict:
    """The output settings of a draft form, each within what the chosen model offers
    (blank: the project's setting, resolved at claim)."""
    model = (data.get("model") or "").strip()
    allowed_models = [choice[0] for choice in model_choices(project, provider)]
    if model and allowed_models and model not in allowed_models:
        raise ServiceError(f"model {model!r} is not offered by this provider for {project.kind}")
    offered = option_lists(project, provider, model or project.model)
    values = {"model": model} if model else {}
    for name, allowed in offered.items():
        value = (data.get(name) or "").strip()
        if not value:
            continue
        if allowed and value not in allowed:
            raise ServiceError(f"{name.replace('_', ' ')} {value!r} is not offered by the model")
        if name == "duration":
            if not value.isdigit():
                raise ServiceError("duration must be a whole number of seconds")
            value = int(value)
        values[name] = value
    return values


def form_references(request, *, keep=()) -> tuple[list[str], list]:
    """(references, uploads) of a draft form: kept ones (editing) and album images picked,
    and the image files uploaded — checked and stored by the draft services once the
    whole draft is valid (as the project owner's: an operator acting on a project stores
    them there)."""
    picked = [value for value in request.POST.getlist("reference") if value]
    return [*keep, *picked], request.FILES.getlist("reference_files")


# --- The drafts section -----------------------------------------------------------------


def drafts_context(request, project: Project) -> dict:
    """The drafts list (a page of PAGE_SIZE), and the add form's fields."""
    paginator = Paginator(project_drafts(project), PAGE_SIZE)
    page = paginator.get_page(request.GET.get("drafts_page"))
    drafts = list(page.object_list)
    for job in drafts:
        job.thumbnails = reference_thumbnails(job.references)
        job.cost, _ = job_estimate(job, project, job.provider or project.provider)
    return {
        "drafts": drafts,
        "drafts_page": page,
        "album_images": album_images(project),
        "max_references": references.MAX_REFERENCES,
        **fields_context(project, request.GET),
    }


@login_required
def draft_options(request, project_id):
    """The provider / model / option fields for what is chosen now (a partial: the page
    swaps it in place, so nothing typed elsewhere in the form is touched)."""
    project = own(Project, request.user, id=project_id)
    return render(request, "queue_app/drafts/fields.html", fields_context(project, request.GET))


@login_required
@require_POST
def drafts_add(request, project_id):
    project = own_to_act(Project, request.user, id=project_id)
    created = 0
    try:
        quantity = request.POST.get("quantity") or "1"
        if not quantity.isdigit():
            raise ServiceError(f"quantity must be a whole number from 1 to {MAX_DRAFTS_PER_REQUEST}")
        if not request.POST.get("prompt", "").strip():
            raise ServiceError("a prompt is required")
        provider = chosen_provider(request.POST, project)
        settings_ = form_settings(project, provider, request.POST)
        settings_["references"], uploads = form_references(request)
        jobs = jobs_create_drafts(
            user=project.owner,
            project=project,
            prompt=request.POST.get("prompt", ""),
            quantity=int(quantity[:6]),
            provider=provider,
            settings_=settings_,
            per_line=request.POST.get("per_line") == "on",
            uploads=uploads,
        )
        created = len(jobs)
        messages.success(request, f"{created} draft(s) created")
    except ServiceError as error:
        messages.error(request, error.message)
    response = back_to_project(project, request)
    if isinstance(response, JsonResponse):
        # the page clears the prompt only when the drafts were made (and only if the
        # text is still what was sent: what was typed meanwhile stays)
        notes = [{"level": m.tags, "text": str(m)} for m in messages.get_messages(request)]
        return JsonResponse({"messages": notes, "created": created})
    return response


def selected_drafts(request, project: Project) -> list:
    """The ticked drafts, or every draft of the project when "all N drafts" was chosen."""
    if request.POST.get("all") == "1":
        return list(project_drafts(project).values_list("id", flat=True))
    return [value for value in request.POST.getlist("job") if is_uuid(value)]


@login_required
@require_POST
def drafts_delete(request, project_id):
    project = own_to_act(Project, request.user, id=project_id)

    def delete(ids) -> int:
        return draft_writes.drafts_delete(user=project.owner, project=project, job_ids=ids)

    ids = selected_drafts(request, project)
    return act_on_selected(
        request, project, ids, act=delete, none="select drafts first: nothing was deleted", done="{} draft(s) deleted"
    )


@login_required
@require_POST
def drafts_duplicate(request, project_id):
    project = own_to_act(Project, request.user, id=project_id)

    def duplicate(ids) -> int:
        return len(draft_writes.drafts_duplicate(user=project.owner, project=project, job_ids=ids))

    ids = selected_drafts(request, project)
    return act_on_selected(
        request, project, ids, act=duplicate, none="select drafts first: nothing was duplicated", done="{} draft(s) duplicated"
    )


@login_required
def draft_edit(request, project_id, job_id):
    project = own_to_act(Project, request.user, id=project_id)
    job = Job.objects.filter(id=job_id, project=project).select_related("provider").first()
    if job is None:
        raise Http404("not found")
    if job.status != "draft":
        messages.error(request, "this job is no longer a draft: it cannot be edited")
        return redirect("project_detail", project_id=project.id)
    prompt = job.prompt
    if request.method == "POST":
        prompt = request.POST.get("prompt", "")
        try:
            keep = [value for value in request.POST.getlist("keep") if value in (job.references or [])]
            provider = chosen_provider(request.POST, project)
            settings_ = form_settings(project, provider, request.POST)
            settings_["references"], uploads = form_references(request, keep=keep)
            draft_update(
                user=project.owner, job_id=job.id, prompt=prompt, provider=provider, settings_=settings_, uploads=uploads
            )
            messages.success(request, "draft saved")
            return redirect("project_detail", project_id=project.id)
        except ServiceError as error:
            messages.error(request, error.message)
    data = request.POST if request.method == "POST" else {}
    context = {
        "job": job,
        "prompt": prompt,
        "thumbnails": list(zip(job.references or [], reference_thumbnails(job.references), strict=True)),
        "album_images": album_images(project),
        "max_references": references.MAX_REFERENCES,
        **fields_context(project, data, job=job),
    }
    return render(request, "queue_app/drafts/edit.html", context)


@login_required
def reference_file(request, sha256):
    """An uploaded reference image, for its owner only, with the album's hardening."""
    row = reference_of(request.user, sha256)
    if row is None or not row.file:
        raise Http404("not found")
    return album_files.harden(FileResponse(row.file.open("rb")), row.content_type, filename=f"reference-{sha256[:12]}")


def reference_thumbnails(values) -> list[dict]:
    """What a draft row shows for each reference: a local image's thumbnail address, or a
    URL's host."""
    shown = []
    for value in values or []:
        if value.startswith("ref:"):
            shown.append({"src": reverse("reference_file", args=[value[4:]]), "title": "uploaded image"})
        elif value.startswith("album:") and value[6:].isdigit():
            shown.append({"src": reverse("album_file", args=[int(value[6:])]), "title": "album image"})
        else:
            shown.append({"src": "", "title": value[:80]})
    return shown
