"""The album's compare view: a project's outputs side by side by provider and model, one
row a prompt (selectors/compare.py). What a fan-out (a workflow's `provider` items) is for."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from queue_app.models import Project
from queue_app.selectors.compare import compare_page
from queue_app.web.shortcuts import own


@login_required
def album_compare(request, project_id: int):
    project = own(Project, request.user, id=project_id)
    page = request.GET.get("page", "1")
    page = int(page) if page.isdigit() and len(page) < 7 else 1
    return render(request, "queue_app/compare.html", {"project": project, **compare_page(project, page)})
