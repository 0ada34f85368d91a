"""Bulk actions on the monitor's job list: retry, clear or cancel the selected jobs, or
all N jobs the current filters match.

POST /queue/jobs/bulk with `op` = "<action>:selected" (with `job_ids`) or
"<action>:matching" (with the list's filters: state, provider, project, model, error, q).
The first POST shows how many jobs the action will touch; `confirm=1` acts. "All
matching" is recomputed at confirmation through the same selector the list used
(`job_list.matching_job_ids`), at most BULK_LIMIT jobs per request. Retry and
clear act on the failed jobs among them, cancel on the pending and processing ones; the
services skip the rest and anything the user may not touch.
"""

import logging
import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_POST

from queue_app import limits
from queue_app.models import Job, Status
from queue_app.selectors import job_list
from queue_app.selectors.visibility import actable_to
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import selected_failed_clear, selected_failed_retry
from queue_app.web.monitor import back, filters_from, safe_next

log = logging.getLogger(__name__)

ACTIONS = {
    # action: (statuses it acts on, verb)
    "retry": ((Status.FAILED,), "retry"),
    "clear": ((Status.FAILED,), "clear"),
    "cancel": ((Status.PENDING, Status.PROCESSING), "cancel"),
}
MAX_SELECTED = limits.BULK_SELECTED


def cancel_jobs(*, user, job_ids) -> dict:
    """Cancel the selected jobs the user may act on, through the same path as the API and
    the monitor's row Cancel (each owner's jobs through services); the others are skipped."""
    from queue_app.web import api

    mine = [str(i) for i in actable_to(user, Job).filter(id__in=list(job_ids)).values_list("id", flat=True)]
    if not mine:
        return {"done": 0}
    return {"done": api.jobs_cancel(user, mine)["cancelled"]}


def _run(action: str, *, user, job_ids) -> int:
    if action == "retry":
        return selected_failed_retry(user=user, job_ids=job_ids)["retried"]
    if action == "clear":
        return selected_failed_clear(user=user, job_ids=job_ids)["cleared"]
    return cancel_jobs(user=user, job_ids=job_ids)["done"]


def _selected_ids(request) -> list[str]:
    ids = []
    for value in request.POST.getlist("job_ids")[:MAX_SELECTED]:
        try:
            ids.append(str(uuid.UUID(value)))
        except ValueError:
            continue
    return ids


@login_required
@require_POST
def bulk_action(request):
    action, _, scope = (request.POST.get("op") or "").partition(":")
    if action not in ACTIONS or scope not in ("selected", "matching"):
        messages.error(request, "unknown action")
        return back(request)
    filters = filters_from(request.POST)
    if scope == "matching":
        job_ids = job_list.matching_job_ids(user=request.user, filters=filters)
    else:
        job_ids = _selected_ids(request)
    if not job_ids:
        messages.error(request, "no jobs selected")
        return back(request)
    statuses, verb = ACTIONS[action]
    affected = actable_to(request.user, Job).filter(id__in=job_ids, status__in=statuses).count()
    if request.POST.get("confirm") != "1":
        return render(
            request,
            "queue_app/confirm_bulk.html",
            {
                "op": f"{action}:{scope}",
                "verb": verb,
                "scope": scope,
                "listed": len(job_ids),
                "capped": scope == "matching" and len(job_ids) >= job_list.BULK_LIMIT,
                "count": affected,
                "job_ids": job_ids if scope == "selected" else [],
                "filters": filters,
                "next": safe_next(request),
            },
        )
    try:
        done = _run(action, user=request.user, job_ids=job_ids)
    except ServiceError as refusal:
        messages.error(request, refusal.message)
        return back(request)
    skipped = len(job_ids) - done
    messages.success(request, f"{done} job(s): {verb} done" + (f"; {skipped} skipped" if skipped else ""))
    log.info("monitor: bulk %s (%s) by user %s: %d of %d job(s)", action, scope, request.user.pk, done, len(job_ids))
    return back(request)
