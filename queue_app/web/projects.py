"""Project pages: the list (archived ones hidden unless asked for), create, edit,
archive / unarchive, delete with a confirmation that counts what goes. Thin: the form
parses, `services.project_*` validates and writes, `selectors` read."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from queue_app import limits
from queue_app.models import Kind, Project, Provider
from queue_app.providers.catalogue import CATALOGUE
from queue_app.selectors.projects import own_projects, project_footprint, storage_summary
from queue_app.services import projects as project_writes
from queue_app.services.drafts import MAX_PROMPT_CHARS
from queue_app.services.errors import ServiceError
from queue_app.services.projects import PROJECT_TEXT_FIELDS, project_create, project_set_archived, project_update
from queue_app.web.shortcuts import own


class ProjectForm(forms.Form):
    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(choices=Kind.choices, initial=Kind.IMAGE)
    provider_id = forms.TypedChoiceField(label="Provider", coerce=int, empty_value=None, required=False)
    model = forms.CharField(max_length=200, required=False, help_text="blank: the provider's default for the kind")
    aspect_ratio = forms.CharField(label="Aspect ratio", max_length=30, required=False)
    quality = forms.CharField(max_length=30, required=False)
    resolution = forms.CharField(max_length=30, required=False)
    format = forms.CharField(max_length=10, required=False)
    background = forms.CharField(max_length=20, required=False)
    duration = forms.IntegerField(label="Duration (seconds)", min_value=1, max_value=600, required=False)
    sound = forms.ChoiceField(choices=[("", "default"), ("on", "on"), ("off", "off")], required=False)
    system_prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), max_length=MAX_PROMPT_CHARS, required=False)
    temperature = forms.FloatField(min_value=0, max_value=2, required=False)
    max_tokens = forms.IntegerField(label="Max tokens", min_value=1, max_value=1_000_000, required=False)
    share_weight = forms.IntegerField(
        label="Fair-share weight",
        min_value=limits.SHARE_WEIGHT.low,
        max_value=limits.SHARE_WEIGHT.high,
        required=False,
        help_text="its share of a provider's slots beside other projects with work there (blank: 1)",
    )

    # The weight is the project's, not a draft default: it comes before that fieldset.
    field_order = ["name", "kind", "provider_id", "model", "share_weight"]

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        providers = Provider.objects.filter(owner=user).order_by("name", "id")
        self.fields["provider_id"].choices = [("", "none")] + [(p.id, f"{p.name} ({p.family})") for p in providers]


def model_options(user) -> list[tuple[str, str]]:
    """Every model the user's providers offer, for the form's suggestion list."""
    seen, options = set(), []
    for provider in Provider.objects.filter(owner=user):
        for spec in CATALOGUE.get(provider.family, {}).values():
            if spec.id not in seen:
                seen.add(spec.id)
                options.append((spec.id, f"{spec.name} · {spec.kind} · {provider.family}"))
        for alias in provider.model_aliases or {}:
            if alias not in seen:
                seen.add(alias)
                options.append((alias, f"{alias} (alias on {provider.name})"))
    return options


def initial_of(project: Project) -> dict:
    data = {name: getattr(project, name) for name in PROJECT_TEXT_FIELDS}
    data.update(
        name=project.name,
        kind=project.kind,
        provider_id=project.provider_id,
        duration=project.duration,
        temperature=project.temperature,
        max_tokens=project.max_tokens,
        share_weight=project.share_weight,
    )
    return data


@login_required
def project_list(request):
    show = request.GET.get("show", "")
    archived = {"archived": True, "all": None}.get(show, False)
    projects = own_projects(request.user, archived=archived)
    hidden = Project.objects.filter(owner=request.user, archived=True).count() if archived is False else 0
    return render(
        request,
        "queue_app/project_list.html",
        {"projects": projects, "show": show, "archived_hidden": hidden, "storage": storage_summary(request.user)},
    )


@login_required
def project_edit(request, project_id=None):
    """Create (no id) or edit a project of the signed-in user."""
    project = own(Project, request.user, id=project_id) if project_id else None
    if project is not None and project.owner_id != request.user.id:
        messages.error(request, "only the project's owner can change it")
        return redirect("project_detail", project_id=project.id)
    form = ProjectForm(request.POST or None, user=request.user, initial=initial_of(project) if project else None)
    if request.method == "POST" and form.is_valid():
        data = {name: value for name, value in form.cleaned_data.items()}
        try:
            if project is None:
                project = project_create(user=request.user, data=data)
                messages.success(request, f"project “{project.name}” created")
            else:
                project_update(user=request.user, project=project, data=data)
                messages.success(request, "project saved")
            return redirect("project_detail", project_id=project.id)
        except ServiceError as error:
            form.add_error(None, error.message)
    return render(
        request, "queue_app/project_form.html", {"form": form, "project": project, "models": model_options(request.user)}
    )


@login_required
@require_POST
def project_archive(request, project_id):
    project = own(Project, request.user, id=project_id)
    archived = request.POST.get("archived", "1") == "1"
    try:
        project_set_archived(user=request.user, project=project, archived=archived)
        messages.success(request, f"project “{project.name}” {'archived' if archived else 'restored'}")
    except ServiceError as error:
        messages.error(request, error.message)
    return redirect("project_list") if archived else redirect("project_detail", project_id=project.id)


@login_required
def project_delete(request, project_id):
    """GET: what would go (jobs, album items, bytes). POST: delete it."""
    project = own(Project, request.user, id=project_id)
    if request.method == "POST":
        try:
            summary = project_writes.project_delete(user=request.user, project=project)
            cancelled = summary["cancelled"]
            note = f" ({cancelled} pending or running job{'s' if cancelled != 1 else ''} cancelled first)" if cancelled else ""
            messages.success(request, f"project “{project.name}” deleted{note}")
            return redirect("project_list")
        except ServiceError as error:
            messages.error(request, error.message)
    footprint = project_footprint(project)
    return render(request, "queue_app/project_delete.html", {"project": project, "footprint": footprint})
