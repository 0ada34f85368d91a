"""Whether detached polling keeps up, per provider record: the monitor's "polling behind"
badge, the status API's fields and the metrics' gauges.

Two ways to fall behind, both reported rather than hidden in a stretched cycle:
- the record's status budget (providers/budget.py) cannot check every detached task once
  per cadence — known before it happens, from the task count alone;
- checks run late whatever the budget (slow answers, too few poll threads, no queue
  service): tasks whose check is overdue by more than a whole cycle.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Min, Q

from queue_app.engine import runner_registry
from queue_app.models import Job, Status
from queue_app.providers import budget, poll_seconds


def poll_lag(provider_ids, *, now) -> dict:
    """{provider id: lag} for the records among `provider_ids` with detached tasks, one
    query. A lag: tasks, budget_per_minute, cycle_seconds (one round of every task at the
    budget, or as late as the checks run), behind (tasks not checked within their
    cadence; 0 when polling keeps up) and message ('' when it does)."""
    if not provider_ids:
        return {}
    late = now - timedelta(seconds=settings.DETACHED_POLL_SECONDS)
    rows = (
        Job.objects.filter(status=Status.PROCESSING, active_provider_id__in=list(provider_ids))
        .exclude(task_id="")
        .exclude(project__kind__in=runner_registry.kinds())
        .values("active_provider_id", "active_provider__family", "active_provider__options")
        .annotate(n=Count("id"), overdue=Count("id", filter=Q(next_poll_at__lt=late)), oldest=Min("next_poll_at"))
        .order_by()
    )
    result = {}
    for row in rows:
        family, options, tasks = row["active_provider__family"], row["active_provider__options"], row["n"]
        per_minute = budget.per_minute(family, options)
        cadence = poll_seconds(family)
        cycle = max(cadence, budget.requests_for(family, tasks) * 60.0 / per_minute)
        short = budget.shortfall(family, options, tasks)
        behind = max(short.tasks if short else 0, row["overdue"])
        if row["overdue"] and row["oldest"]:
            cycle = max(cycle, cadence + (now - row["oldest"]).total_seconds())
        message = ""
        if behind:
            why = "the status budget" if short else "checks running late"
            message = f"polling behind: {behind} tasks, cycle ≈ {cycle:.0f} s ({why}; every {cadence:g} s wanted)"
        result[row["active_provider_id"]] = {
            "tasks": tasks,
            "budget_per_minute": per_minute,
            "cycle_seconds": round(cycle, 1),
            "behind": behind,
            "message": message,
        }
    return result
