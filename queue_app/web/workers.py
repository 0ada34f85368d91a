"""The workers page (/queue/workers/): every live process, the job each worker runs now
and for how long, and recently dead processes with what they held and what became of it.

Reads go through `selectors_workers.workers_overview` (four queries whatever the number of
jobs). Users see the processes and only their own jobs; staff see every job. The page
refreshes its live part like the monitor (`?fragment=1`), with a pause switch.
"""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from queue_app.selectors import workers as selectors_workers
from queue_app.web.monitor import REFRESH_SECONDS, age


def _ages(rows, *keys):
    """Each `x_seconds…` value also as `x…` in human units (3m 04s), never a raw float."""
    for row in rows:
        for key in keys:
            row[key.replace("_seconds", "")] = age(row[key]) if row[key] is not None else ""
    return rows


@login_required
def workers(request):
    overview = selectors_workers.workers_overview(user=request.user)
    for process in overview["live"]:
        _ages([process], "seen_seconds_ago", "up_seconds")
        _ages(process["running"], "running_seconds")
    for process in overview["dead"]:
        _ages([process], "seen_seconds_ago", "up_seconds", "released_seconds_ago")
    _ages(overview["unplaced"], "running_seconds")
    context = {"overview": overview, "refresh_seconds": REFRESH_SECONDS}
    template = "queue_app/workers_live.html" if request.GET.get("fragment") else "queue_app/workers.html"
    return render(request, template, context)
