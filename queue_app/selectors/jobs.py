"""One job's page and the album: job_detail, album groups and counts, statuses, attention rows."""

from django.db.models import Count, Q
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.models import AlbumItem, ErrorClass, Job, Status
from queue_app.selectors.job_list import job_row
from queue_app.selectors.visibility import visible_jobs, visible_providers

LAYER_ROLES = ("layer",)


SNAPSHOT_FIELDS = (
    ("provider_name", "Provider"),
    ("family", "Family"),
    ("kind", "Kind"),
    ("model", "Model"),
    ("aspect_ratio", "Aspect ratio"),
    ("resolution", "Resolution"),
    ("quality", "Quality"),
    ("format", "Format"),
    ("background", "Background"),
    ("duration", "Duration (s)"),
    ("sound", "Sound"),
    ("temperature", "Temperature"),
    ("max_tokens", "Max tokens"),
    ("system_prompt", "System prompt"),
)


def album_grouped(items) -> list[dict]:
    """Album items grouped under their job, in the order given: the base image(s) first,
    its layers under it."""
    groups: dict = {}
    for item in items:
        key = item.job_id or f"item-{item.id}"
        group = groups.setdefault(key, {"job_id": item.job_id, "prompt": item.prompt, "main": [], "layers": []})
        (group["layers"] if item.role in LAYER_ROLES else group["main"]).append(item)
    return list(groups.values())


def album_counts(project) -> dict:
    """{"items": outputs that are not layers, "layers": layers} — the album's headline."""

    layers = Q(role__in=LAYER_ROLES)
    counts = AlbumItem.objects.filter(project=project).aggregate(
        items=Count("id", filter=~layers), layers=Count("id", filter=layers)
    )
    return {"items": counts["items"] or 0, "layers": counts["layers"] or 0}


def album_zip_items(project):
    """Every album item of a project for the zip download, oldest first, one row at a time."""

    return AlbumItem.objects.filter(project=project).order_by("created_at", "job_id", "output_index", "id").iterator(100)


def job_detail(job: Job, *, user, now=None) -> dict:
    """Everything the job page shows: the row the monitor shows (with the attempt log),
    the resolved snapshot, and the job's album items (layers grouped under the base)."""
    now = now or timezone.now()
    providers = visible_providers(user)
    live = heartbeats.liveness(now=now)
    attempts = list(job.attempt_log.order_by("number", "id"))
    for attempt in attempts:
        attempt.phases = attempt_phases(attempt)
    row = job_row(job, providers=providers, live=live, now=now, attempts=attempts)
    snap = job.resolved or {}
    snapshot = [(label, snap.get(key)) for key, label in SNAPSHOT_FIELDS if snap.get(key) not in (None, "")]
    if snap.get("model_alias_of"):  # an alias reads as what it resolved to
        snapshot = [(label, f"{value} → {snap['model_alias_of']}" if label == "Model" else value) for label, value in snapshot]
    outputs = list(job.album_items.order_by("output_index", "id"))
    return {
        "job": job,
        "row": row,
        "attempts": attempts,
        "snapshot": snapshot,
        "params": snap.get("params") or job.params or {},
        "resolved": bool(snap),
        "outputs": album_grouped(outputs),
        "output_count": len(outputs),
        "retryable": job.status == Status.FAILED,
    }


PHASE_LABELS = {"submit": "submitted", "remote": "at the provider", "collect": "collected"}


def attempt_phases(attempt) -> list[dict]:
    """The phases one attempt went through, each with its start and end ({"phase", "label",
    "start", "end"}): a detached task's submit, its time at the provider and its
    collection; [] for a call that answered at once (one phase, the attempt itself)."""
    if attempt.detached_at is None:
        return []
    bounds = [
        ("submit", attempt.started_at, attempt.detached_at),
        ("remote", attempt.detached_at, attempt.collecting_at or (attempt.finished_at if attempt.phase == "remote" else None)),
    ]
    if attempt.collecting_at is not None:
        bounds.append(("collect", attempt.collecting_at, attempt.finished_at))
    return [{"phase": phase, "label": PHASE_LABELS[phase], "start": start, "end": end} for phase, start, end in bounds]


def jobs_by_status(job_ids) -> dict:
    """{status: count} of these jobs (one grouped query): what start_jobs' wait watches."""
    rows = Job.objects.filter(id__in=list(job_ids)).values_list("status").annotate(n=Count("id")).order_by()
    return {status: n for status, n in rows}


ATTENTION_ROWS = 50


def attention_jobs(user, *, limit: int = ATTENTION_ROWS) -> dict:
    """Jobs held for attention that `user` may act on, newest first, and how many in all."""
    jobs = visible_jobs(user).filter(status=Status.FAILED, error_class=ErrorClass.ATTENTION)
    rows = jobs.order_by("-finished_at", "-id").values(
        "id", "prompt", "error", "finished_at", "project_id", "project__name", "provider__name", "project__provider__name"
    )[:limit]
    return {"count": jobs.count(), "jobs": list(rows)}
