"""What the pages, the monitor and the API show about a project's ComfyUI instance (reads
only; the runner writes these fields in runner/instance.py and runner/check.py).

An unreachable instance is named on each affected job and project as
"instance unreachable since 11:32 — in-flight jobs fail at 11:42": until then nothing fails,
and never-sent jobs keep waiting (runner/claim.py takes no work for it).
"""

from django.utils import timezone

from comfy_app.models import ComfyInstance
from comfy_app.runner.instance import UNREACHABLE_LIMIT


def _hhmm(value) -> str:
    return timezone.localtime(value).strftime("%H:%M")


def outage_message(since, now) -> str:
    fail_at = since + UNREACHABLE_LIMIT
    if now < fail_at:
        return f"instance unreachable since {_hhmm(since)} — in-flight jobs fail at {_hhmm(fail_at)}"
    return (
        f"instance unreachable since {_hhmm(since)} — in-flight jobs failed at {_hhmm(fail_at)}; "
        "waiting jobs start when it answers"
    )


def instance_health(project_ids, now=None) -> dict:
    """{project_id: {base_url, reachable, unreachable_since, fail_at, message, last_error,
    last_checked_at}} for the ComfyUI instances of these projects (one query)."""
    now = now or timezone.now()
    rows = {}
    fields = ("project_id", "project__name", "base_url", "unreachable_since", "last_error", "last_checked_at", "back_at")
    for row in ComfyInstance.objects.filter(project_id__in=list(project_ids)).values(*fields):
        since = row["unreachable_since"]
        rows[row["project_id"]] = {
            "project_id": row["project_id"],
            "project_name": row["project__name"],
            "base_url": row["base_url"],
            "reachable": since is None,
            "unreachable_since": since.isoformat() if since else None,
            "fail_at": (since + UNREACHABLE_LIMIT).isoformat() if since else None,
            "message": outage_message(since, now) if since else "",
            "last_error": row["last_error"] if since else "",
            "last_checked_at": row["last_checked_at"].isoformat() if row["last_checked_at"] else None,
            "back_at": row["back_at"].isoformat() if row["back_at"] else None,
        }
    return rows
