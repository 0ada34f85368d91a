"""The job page: what a job was resolved to, what it produced, every attempt, Retry.

Thin like every page: the lookup is scoped to the signed-in user (`shortcuts.own`), the
read is `selectors.job_detail`, the retry is `jobs_retry`. `?fragment=1`
answers the sections alone, which the page's live-update script swaps in.
"""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from queue_app.engine import events
from queue_app.models import Job, Status
from queue_app.selectors import jobs as job_reads
from queue_app.selectors.queue import runner_health
from queue_app.selectors.spend import job_lines
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_retry
from queue_app.web.shortcuts import own, own_to_act


@login_required
def job_detail(request, job_id):
    job = own(Job, request.user, id=job_id)
    fragment = bool(request.GET.get("fragment"))
    if not fragment:
        # The socket replays events after this seq: read it before the job, or an event
        # committed between the two reads is neither on the page nor replayed.
        last_seq = events.last_seq(job.project_id)
        job.refresh_from_db()
    context = job_reads.job_detail(job, user=request.user)
    context["charges"] = job_lines(job.id)
    if job.status in (Status.PENDING, Status.PROCESSING):
        health = runner_health([job.project_id])
        context["instance_warning"] = (health.get(job.project_id) or {}).get("message", "")
    context["params_text"] = json.dumps(context["params"], indent=2, sort_keys=True) if context["params"] else ""
    if fragment:
        return render(request, "queue_app/job_sections.html", context)
    context["last_seq"] = last_seq
    return render(request, "queue_app/job_detail.html", context)


@login_required
@require_POST
def job_retry(request, job_id):
    job = own_to_act(Job, request.user, id=job_id)
    try:
        result = jobs_retry(user=job.owner, job_ids=[job.id])
        if result["retried"]:
            messages.success(request, "job retried")
        else:
            messages.error(request, "only a failed job can be retried")
    except ServiceError as error:
        messages.error(request, error.message)
    return redirect("job_detail", job_id=job.id)
