"""The refusals of acting on what a user may only see (the rule is selectors/visibility.py's).

Every door that changes another user's rows, starts work billed to them or uses their
secrets goes through these: a row the user cannot see is "not found" (404, ids are not
probed); a row they may see but not act on is a 403 that says why.
"""

from queue_app.models import Job
from queue_app.selectors.visibility import actable_to, may_act, may_see, permission_for, visible_to
from queue_app.services.errors import ServiceError

# Acting on another user's jobs (drafting, starting, retrying, cancelling, clearing them).
JOBS = permission_for(Job)


def acting_on(user, row, *, noun: str, permission: str | None = None):
    """`row` if `user` may act on it; ServiceError 404 (not visible) or 403 (only visible)."""
    if not may_see(user, row):
        raise ServiceError(f"{noun} not found", 404)
    if not may_act(user, row, permission=permission):
        raise ServiceError(f"you may see this {noun} but not act on it: it belongs to another user", 403)
    return row


def acting_on_jobs(user, job_ids) -> list[str]:
    """The ids of `job_ids` (all of them, each one visible and actable), or the refusal for
    the first that is not: an unknown or invisible id is 404, another user's is 403."""
    wanted = {str(job_id) for job_id in job_ids}
    visible = {str(job_id) for job_id in visible_to(user, Job).filter(id__in=wanted).values_list("id", flat=True)}
    if visible != wanted:
        raise ServiceError("job not found", 404, field="job_ids")
    actable = actable_to(user, Job).filter(id__in=wanted).count()
    if actable != len(wanted):
        raise ServiceError("you may see these jobs but not act on all of them: some belong to another user", 403)
    return sorted(wanted)
