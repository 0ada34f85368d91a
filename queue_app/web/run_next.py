"""The Run next buttons: on the project page (a row, or the selected jobs), the job page
and the Queue Monitor. Thin like every page: the service does the work (jobs_run_next,
through api.jobs_run_next for the rule on whose jobs one may act)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from queue_app.models import Job, Project
from queue_app.selectors.visibility import actable_to
from queue_app.web import api, monitor
from queue_app.web.shortcuts import back_to_project, job_ids, own_to_act, ticked_jobs


def _say(request, result: dict) -> None:
    skipped = f"; {result['skipped']} skipped (not pending)" if result["skipped"] else ""
    messages.success(request, f"{len(result['moved'])} job(s) moved to the front{skipped}")


@login_required
@require_POST
def project_run_next(request, project_id):
    """One row's Run next (`only`) or the ticked jobs (`job`) of a project."""
    project = own_to_act(Project, request.user, id=project_id)
    ids = ticked_jobs(project, request)
    if not ids:
        messages.error(request, "select pending jobs first")
    else:
        _say(request, api.jobs_run_next(request.user, ids))
    return back_to_project(project, request)


@login_required
@require_POST
def job_run_next(request, job_id):
    job = own_to_act(Job, request.user, id=job_id)
    _say(request, api.jobs_run_next(request.user, [str(job.id)]))
    return redirect("job_detail", job_id=job.id)


@login_required
@require_POST
def monitor_run_next(request):
    """A monitor row's Run next (or several ticked rows); back to the monitor view."""
    ids = job_ids(request.POST.getlist("job"))
    ids = [str(i) for i in actable_to(request.user, Job).filter(id__in=ids).values_list("id", flat=True)]
    if not ids:
        messages.error(request, "select pending jobs first")
    else:
        _say(request, api.jobs_run_next(request.user, ids))
    return monitor.back(request)
