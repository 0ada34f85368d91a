"""Pages. Thin: parse, call one service or selector, render. Every lookup is scoped to
the signed-in user, so another user's project, provider or job answers 404."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from queue_app import crypto, net, services
from queue_app.models import AlbumItem, Family, Job, Project, Provider, Status


def own(model, user, **lookup):
    """An object the user owns, or 404 — staff see everyone's."""
    queryset = model.objects.all() if user.is_staff else model.objects.filter(owner=user)
    return get_object_or_404(queryset, **lookup)


@login_required
def project_list(request):
    projects = Project.objects.filter(owner=request.user).select_related("provider")
    return render(request, "queue_app/project_list.html", {"projects": projects})


@login_required
def project_detail(request, project_id):
    project = own(Project, request.user, id=project_id)
    jobs = project.jobs.order_by("-created_at")[:200]
    return render(request, "queue_app/project_detail.html", {"project": project, "jobs": jobs, "Status": Status})


@login_required
@require_POST
def project_start(request, project_id):
    project = own(Project, request.user, id=project_id)
    ids = request.POST.getlist("job")
    try:
        if ids:
            result = services.jobs_start(user=project.owner, project=project, job_ids=ids)
        else:
            result = services.jobs_start(user=project.owner, project=project, all_drafts=True)
        messages.success(request, f"{len(result['started'])} job(s) started")
    except services.ServiceError as error:
        messages.error(request, error.message)
    return redirect("project_detail", project_id=project.id)


class DraftForm(forms.Form):
    prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=services.MAX_PROMPT_CHARS)
    quantity = forms.IntegerField(min_value=1, max_value=services.MAX_DRAFTS_PER_REQUEST, initial=1)


@login_required
@require_POST
def project_drafts(request, project_id):
    project = own(Project, request.user, id=project_id)
    form = DraftForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
        return redirect("project_detail", project_id=project.id)
    try:
        jobs = services.jobs_create_drafts(
            user=project.owner, project=project, prompt=form.cleaned_data["prompt"], quantity=form.cleaned_data["quantity"]
        )
        messages.success(request, f"{len(jobs)} draft(s) created")
    except services.ServiceError as error:
        messages.error(request, error.message)
    return redirect("project_detail", project_id=project.id)


@login_required
def job_detail(request, job_id):
    job = own(Job, request.user, id=job_id)
    return render(request, "queue_app/job_detail.html", {"job": job, "attempts": job.attempt_log.all()})


@login_required
def provider_list(request):
    providers = Provider.objects.filter(owner=request.user)
    return render(request, "queue_app/provider_list.html", {"providers": providers, "families": Family.choices})


class ProviderEditForm(forms.ModelForm):
    api_key = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False))

    class Meta:
        model = Provider
        fields = ["name", "family", "base_url", "concurrency", "max_attempts", "paused"]

    def clean_base_url(self):
        url = self.cleaned_data.get("base_url")
        if url:
            try:
                return net.validate_base_url(url)
            except ValueError as error:
                raise forms.ValidationError(str(error)) from None
        return url


@login_required
def provider_edit(request, provider_id=None):
    provider = own(Provider, request.user, id=provider_id) if provider_id else Provider(owner=request.user)
    form = ProviderEditForm(request.POST or None, instance=provider)
    if request.method == "POST" and form.is_valid():
        obj = form.save(commit=False)
        if form.cleaned_data.get("api_key"):
            obj.api_key = form.cleaned_data["api_key"]
        obj.save()
        messages.success(request, "provider saved")
        return redirect("provider_list")
    return render(
        request, "queue_app/provider_edit.html", {"form": form, "provider": provider, "key_hint": crypto.hint(provider.api_key)}
    )


@login_required
def album_file(request, item_id, variant="file"):
    """An album item's file, for its owner only (album files are never public URLs)."""
    item = own(AlbumItem, request.user, id=item_id)
    if item.kind == AlbumItem.ItemKind.TEXT:
        return HttpResponse(item.text, content_type="text/plain; charset=utf-8")
    field = item.poster if variant == "poster" else item.file
    if not field:
        raise Http404("no file")
    return FileResponse(field.open("rb"), content_type=item.content_type if variant == "file" else "image/jpeg")
