"""Reuse on the pages (issue 29): a job's (or an album item's job's) "Reuse" form makes a new
draft with the same settings and the prompt changed; the account's prompt templates."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from queue_app.models import Job
from queue_app.selectors.batches import prompt_templates
from queue_app.services.errors import ServiceError
from queue_app.services.reuse import jobs_reuse, prompt_template_delete, prompt_template_save
from queue_app.web.shortcuts import own_to_act


@login_required
@require_POST
def job_reuse(request, job_id):
    job = own_to_act(Job, request.user, id=job_id)
    try:
        [draft] = jobs_reuse(user=job.owner, project=job.project, job_ids=[job.id], prompt=request.POST.get("prompt", ""))
    except ServiceError as refusal:
        messages.error(request, refusal.message)
        return redirect("job_detail", job.id)
    messages.success(request, "A new draft with this job's settings: edit it below, or start it.")
    return redirect(f"/projects/{job.project_id}/#draft-{draft.id}")


@login_required
def templates(request):
    if request.method == "POST":
        try:
            row = prompt_template_save(user=request.user, name=request.POST.get("name", ""), text=request.POST.get("text", ""))
            messages.success(request, f"Saved the template {row.name!r}.")
            return redirect("prompt_templates")
        except ServiceError as refusal:
            messages.error(request, refusal.message)
    return render(request, "queue_app/prompt_templates.html", {"templates": sorted(prompt_templates(request.user).items())})


@login_required
@require_POST
def template_delete(request, name: str):
    prompt_template_delete(user=request.user, name=name)
    return redirect("prompt_templates")
