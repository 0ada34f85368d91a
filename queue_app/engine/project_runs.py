"""Project runs: the bookkeeping behind the finish notification.

A run opens when jobs of the project become pending (`runs_touch`, in the transition's
transaction) and closes exactly once, by a compare-and-set, when nothing of the project
is pending or processing and nothing started or finished for PUSH_SETTLE_SECONDS (a burst
of completions gives one notification). The close records the counts, emits
`project.finished` and writes one outbox row per device, so a process that dies before
the send leaves it to the next (notifications/outbox.py). It lives in the engine because
the state machine opens runs inside its own transaction.

Lock order (PostgreSQL): a run row before the project's event counter, both in
`runs_touch` (jobs_to_pending) and in `run_close`, so the two never deadlock.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, Max, Min, OuterRef, Q
from django.utils import timezone

from queue_app.engine import events, failpoints
from queue_app.models import Job, Project, ProjectRun, PushOutbox, PushSubscription, Status

log = logging.getLogger(__name__)

ACTIVE = (Status.PENDING, Status.PROCESSING)


# --- texts --------------------------------------------------------------------------------


def finish_text(*, total: int, completed: int, failed: int) -> str:
    if failed == 0:
        return "1 job finished." if total == 1 else f"All {total} jobs finished."
    if completed == 0:
        return "1 job failed." if failed == 1 else f"{failed} jobs failed."
    return f"{completed} of {total} jobs finished, {failed} failed."


def finish_payload(project: Project, run: ProjectRun) -> dict:
    return {
        "title": f"{project.name} is done",
        "body": finish_text(total=run.total, completed=run.completed, failed=run.failed),
        "url": f"/projects/{project.id}/",
        "tag": f"project-{project.id}",
        "project": project.id,
        "run": run.id,
        "total": run.total,
        "completed": run.completed,
        "failed": run.failed,
    }


# --- runs -----------------------------------------------------------------------------------


def runs_touch(*, project_ids, at) -> None:
    """Jobs of these projects became pending at `at`: open a run for each project that has
    none, or note the start on the open one. Call inside the transaction of the change.

    The UPDATE comes first on purpose: on PostgreSQL it waits for a `run_close` that holds
    the run's row, then finds the run closed and opens a new one — the new jobs are never
    left in a run that was just closed without them."""
    for project_id in sorted({pid for pid in project_ids if pid}):
        if ProjectRun.objects.filter(project_id=project_id, closed_at__isnull=True).update(last_started_at=at):
            continue
        # ON CONFLICT DO NOTHING against the one-open-run constraint: a concurrent opener wins.
        ProjectRun.objects.bulk_create(
            [ProjectRun(project_id=project_id, opened_at=at, last_started_at=at)], ignore_conflicts=True
        )


def runs_open_missing() -> int:
    """Safety net: a run for every project that has work but no open run."""
    open_run = ProjectRun.objects.filter(project_id=OuterRef("project_id"), closed_at__isnull=True)
    with_work = (
        Job.objects.filter(status__in=ACTIVE)
        .filter(~Exists(open_run))
        .order_by()
        .values("project_id")
        .annotate(first=Min("queued_at"))
    )
    opened = 0
    now = timezone.now()
    for row in with_work:
        at = row["first"] or now
        created = ProjectRun.objects.bulk_create(
            [ProjectRun(project_id=row["project_id"], opened_at=at, last_started_at=at)], ignore_conflicts=True
        )
        opened += len(created)
    return opened


def _run_state(run: ProjectRun) -> dict:
    """Active jobs of the project, and the counts and last finish of the run's jobs (those
    started since the run opened)."""
    in_run = Q(queued_at__gte=run.opened_at)
    return Job.objects.filter(project_id=run.project_id).aggregate(
        active=Count("id", filter=Q(status__in=ACTIVE)),
        completed=Count("id", filter=in_run & Q(status=Status.COMPLETED)),
        failed=Count("id", filter=in_run & Q(status=Status.FAILED)),
        last_finish=Max("finished_at", filter=in_run),
    )


def _settled(run: ProjectRun, state: dict, now) -> bool:
    if state["active"]:
        return False
    last = max(filter(None, [run.last_started_at, state["last_finish"]]))
    return now - last >= timedelta(seconds=settings.PUSH_SETTLE_SECONDS)


def run_close(run_id: int, *, now=None) -> bool:
    """Close a settled run once: the counts, the live event and the outbox rows commit
    together, so whoever wins the compare-and-set is the only one who notifies."""
    now = now or timezone.now()
    with transaction.atomic():
        # The row lock (PostgreSQL) orders us with a concurrent runs_touch; SQLite's
        # IMMEDIATE transaction already serialises writers.
        run = ProjectRun.objects.select_for_update().filter(id=run_id, closed_at__isnull=True).first()
        if run is None:
            return False
        state = _run_state(run)
        if not _settled(run, state, now):
            return False
        total = state["completed"] + state["failed"]
        if not ProjectRun.objects.filter(id=run.id, closed_at__isnull=True).update(
            closed_at=now, total=total, completed=state["completed"], failed=state["failed"]
        ):
            return False
        if total == 0:
            return True  # every job was unstarted again: nothing finished, nothing to say
        run.total, run.completed, run.failed, run.closed_at = total, state["completed"], state["failed"], now
        project = Project.objects.get(id=run.project_id)
        payload = finish_payload(project, run)
        events.emit(project.id, "project.finished", None, "", payload)
        PushOutbox.objects.bulk_create(
            [
                PushOutbox(run=run, subscription_id=sub_id, payload=payload, next_try_at=now)
                for sub_id in PushSubscription.objects.filter(user_id=project.owner_id).values_list("id", flat=True)
            ]
        )
    log.info("project %s finished: run %s, %s completed, %s failed", run.project_id, run.id, run.completed, run.failed)
    return True


def runs_close_settled(*, now=None) -> int:
    now = now or timezone.now()
    closed = 0
    for run in ProjectRun.objects.filter(closed_at__isnull=True):
        # A cheap read first; only a candidate takes the write transaction.
        if _settled(run, _run_state(run), now) and run_close(run.id, now=now):
            closed += 1
            failpoints.hit("push_after_close")
    return closed
