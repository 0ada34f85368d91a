"""What the pages do the same way: find the user's own object (404 otherwise) or one they
may act on (403 when they may only see it), read posted job ids, and answer back to the
project page (a redirect, or JSON for the page's fetch)."""

import uuid

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect

from queue_app.models import Project
from queue_app.selectors.visibility import may_act, visible_to
from queue_app.services.acting import JOBS
from queue_app.services.errors import ServiceError


def own(model, user, **lookup):
    """An object the user owns, or 404 — staff see everyone's."""
    if isinstance(lookup.get("id"), int) and not 0 < lookup["id"] < 2**63:
        raise Http404("not found")  # an id no database column can hold
    return get_object_or_404(visible_to(user, model), **lookup)


def own_to_act(model, user, *, permission: str = JOBS, **lookup):
    """An object the user may act on (drafting, starting, cancelling its jobs): 404 when
    they cannot see it, 403 when they may only see it — staff without the permission
    look, they do not act (selectors/visibility.py)."""
    row = own(model, user, **lookup)
    if not may_act(user, row, permission=permission):
        raise PermissionDenied("you may see this but not act on it: it belongs to another user")
    return row


def is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
        return True
    except ValueError:
        return False


def job_ids(values) -> list[str]:
    """The job ids among posted values, canonical; anything that is not a UUID is dropped."""
    return [str(uuid.UUID(str(value))) for value in values if is_uuid(value)]


def ticked_jobs(project: Project, request) -> list[str]:
    """The project's jobs a page's POST names: one row's button (`only`) or the ticked
    boxes (`job`); ids of other projects and anything not a UUID are dropped."""
    ids = job_ids([request.POST["only"]] if request.POST.get("only") else request.POST.getlist("job"))
    return [str(i) for i in project.jobs.filter(id__in=ids).values_list("id", flat=True)]


def back_to_project(project: Project, request=None):
    """Back to the project page — or, for the page's own fetch() calls, the messages as
    JSON (the page stays put and re-renders its sections)."""
    if request is not None and request.headers.get("X-Requested-With") == "fetch":
        notes = [{"level": m.tags, "text": str(m)} for m in messages.get_messages(request)]
        return JsonResponse({"messages": notes})
    return redirect("project_detail", project_id=project.id)


def act_on_selected(request, project: Project, ids: list, *, act, none: str, done: str):
    """A bulk action on the ticked rows of a project page: `act(ids)` returns how many it
    did, said as `done.format(n)`; nothing ticked says `none`; a refusal is shown."""
    if not ids:
        messages.error(request, none)
        return back_to_project(project, request)
    try:
        messages.success(request, done.format(act(ids)))
    except ServiceError as error:
        messages.error(request, error.message)
    return back_to_project(project, request)
