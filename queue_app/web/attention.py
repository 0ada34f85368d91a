"""The monitor's "Needs attention" list (issue 16): jobs held because the provider may
have accepted their submission without us storing a task id (engine/ambiguous.py).
Resubmit sends them again; Mark failed makes them ordinary failures. Thin: the services
do the work and check who may act (owners; staff on everyone's, like retry and clear)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.views.decorators.http import require_POST

from queue_app.services.errors import ServiceError
from queue_app.services.jobs import attention_mark_failed, attention_resubmit
from queue_app.web import monitor
from queue_app.web.shortcuts import job_ids


@login_required
@require_POST
def attention_action(request, action):
    ids = job_ids(request.POST.getlist("job"))
    try:
        if action == "resubmit":
            done = len(attention_resubmit(user=request.user, job_ids=ids)["resubmitted"])
            messages.success(request, f"{done} job(s) resubmitted")
        elif action == "mark-failed":
            done = attention_mark_failed(user=request.user, job_ids=ids)["marked_failed"]
            messages.success(request, f"{done} job(s) marked failed")
        else:
            messages.error(request, "unknown action")
    except ServiceError as refusal:
        messages.error(request, refusal.message)
    return monitor.back(request)
