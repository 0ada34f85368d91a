"""The list/get reads the API and MCP page through: projects (in the one shape,
projects.project_json), providers, job summaries and album items."""

from django.db.models import Count
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.models import AlbumItem, Job, Provider, Status
from queue_app.selectors.job_list import job_row
from queue_app.selectors.projects import project_counts, project_json
from queue_app.selectors.visibility import visible_jobs, visible_projects, visible_providers, visible_to


def provider_json(provider: Provider) -> dict:
    """A provider as the API shows it: never the key, at most its last four characters."""
    return {
        "id": provider.id,
        "owner_id": provider.owner_id,
        "name": provider.name,
        "family": provider.family,
        "base_url": provider.base_url,
        "key_hint": provider.api_key_hint,
        "has_key": bool(provider.api_key_encrypted),
        "concurrency": provider.concurrency,
        "max_attempts": provider.max_attempts,
        "paused": provider.paused,
        "paused_reason": provider.paused_reason,
        "cooldown_until": provider.cooldown_until.isoformat() if provider.cooldown_until else None,
        "options": provider.options,
        "model_aliases": provider.model_aliases,
        "created_at": provider.created_at.isoformat(),
    }


def projects_after(*, user, after_id: int = 0, limit: int = 50) -> dict:
    """One page of projects by id (keyset: the cost is the page, never the offset)."""
    rows = list(visible_projects(user).filter(id__gt=after_id).order_by("id")[: limit + 1])
    page = [project_json(project) for project in rows[:limit]]
    return {"projects": page, "next_after": page[-1]["id"] if len(rows) > limit else None}


def project_detail(*, user, project_id: int) -> dict | None:
    """A project with its job counts per status (one grouped query)."""
    project = visible_projects(user).filter(id=project_id).first()
    if project is None:
        return None
    return project_json(project, counts=project_counts(project))


def providers_after(*, user, after_id: int = 0, limit: int = 50) -> dict:
    """One page of provider records by id, with their active slots (two queries)."""
    providers = Provider.objects.all() if user.is_staff else Provider.objects.filter(owner=user)
    rows = list(providers.filter(id__gt=after_id).order_by("id")[: limit + 1])
    page = rows[:limit]
    active = dict(
        Job.objects.filter(status=Status.PROCESSING, active_provider_id__in=[p.id for p in page])
        .values_list("active_provider_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    now = timezone.now()
    items = [
        {
            "id": p.id,
            "name": p.name,
            "family": p.family,
            "paused": p.paused,
            "paused_reason": p.paused_reason,
            "cooling_down": bool(p.cooldown_until and p.cooldown_until > now),
            "concurrency": p.concurrency,
            "max_attempts": p.max_attempts,
            "active_slots": active.get(p.id, 0),
            "key_set": bool(p.api_key_encrypted),
        }
        for p in page
    ]
    return {"providers": items, "next_after": page[-1].id if len(rows) > limit else None}


def job_summary(*, user, job_id) -> dict | None:
    """One job as the job page shows it: its row (derived state, resolved settings),
    attempts and album outputs."""
    job = visible_jobs(user).select_related("project").filter(id=job_id).first()
    if job is None:
        return None
    now = timezone.now()
    row = job_row(
        job, providers=visible_providers(user), live=heartbeats.liveness(now=now), now=now, attempts=job.attempt_log.all()
    )
    row["resolved"] = job.resolved
    row["outputs"] = [album_json(item) for item in job.album_items.order_by("output_index")]
    return row


def album_json(item: AlbumItem) -> dict:
    """An album item as the API and MCP list it (its file's links are the web's to add)."""
    return {
        "id": item.id,
        "project_id": item.project_id,
        "job_id": str(item.job_id) if item.job_id else None,
        "index": item.output_index,
        "role": item.role,
        "kind": item.kind,
        "content_type": item.content_type,
        "size": item.size,
        "width": item.width,
        "height": item.height,
        "text": item.text if item.kind == "text" else None,
        "has_file": bool(item.file),
        "created_at": item.created_at.isoformat(),
    }


def album_before(*, user, project_id: int | None = None, before_id: int = 0, limit: int = 50) -> dict:
    """One page of the album items a user may see, newest first by id (keyset): `before_id`
    is the last id of the previous page (0: the first page)."""
    items = visible_to(user, AlbumItem)
    if project_id is not None:
        items = items.filter(project_id=project_id)
    if before_id:
        items = items.filter(id__lt=before_id)
    rows = list(items.order_by("-id")[: limit + 1])
    page = rows[:limit]
    return {"items": [album_json(item) for item in page], "next_before": page[-1].id if len(rows) > limit else None}
