"""Project reads: own projects, footprint and storage, choices, drafts, album images, references."""

from django.db.models import Count

from queue_app.models import AlbumItem, Job, Project, Provider, Status


def own_projects(user, *, archived: bool | None = False) -> list[Project]:
    """The user's projects with `.counts` ({status: n}), newest first. `archived`: False
    hides archived ones (the default list), True lists only them, None lists all."""
    projects_qs = Project.objects.filter(owner=user).select_related("provider")
    if archived is not None:
        projects_qs = projects_qs.filter(archived=archived)
    projects = list(projects_qs)
    counts: dict = {}
    for project_id, job_status, n in (
        Job.objects.filter(project__in=projects).values_list("project_id", "status").annotate(n=Count("id")).order_by()
    ):
        counts.setdefault(project_id, {})[job_status] = n
    for project in projects:
        project.counts = counts.get(project.id, {})
    return projects


def project_footprint(project: Project) -> dict:
    """What deleting a project removes: jobs (and how many are pending or running, which
    the delete cancels first), album items, bytes."""
    from django.db.models import Sum

    from queue_app.models import AlbumItem

    album = AlbumItem.objects.filter(project=project).aggregate(n=Count("id"), total=Sum("size"))
    return {
        "jobs": Job.objects.filter(project=project).count(),
        "active": Job.objects.filter(project=project, status__in=(Status.PENDING, Status.PROCESSING)).count(),
        "album_items": album["n"] or 0,
        "bytes": album["total"] or 0,
    }


PROJECT_DEFAULTS = (
    "aspect_ratio",
    "quality",
    "resolution",
    "format",
    "background",
    "duration",
    "sound",
    "system_prompt",
    "temperature",
    "max_tokens",
)


def project_json(project: Project, *, counts: dict | None = None) -> dict:
    """A project as the JSON API and the MCP tools both show it (agent_schemas.ProjectOut):
    its settings under "defaults", and "counts" ({status: jobs}, every status) when the
    caller read them, else null."""
    return {
        "id": project.id,
        "name": project.name,
        "kind": project.kind,
        "provider_id": project.provider_id,
        "model": project.model,
        "archived": project.archived,
        "share_weight": project.share_weight,
        "defaults": {name: getattr(project, name) for name in PROJECT_DEFAULTS},
        "counts": None if counts is None else {status: counts.get(status, 0) for status in Status.values},
        "created_at": project.created_at.isoformat(),
        "updated_at": project.updated_at.isoformat(),
    }


def project_counts(project: Project) -> dict:
    """{status: jobs} of one project (one grouped query)."""
    return dict(Job.objects.filter(project=project).values_list("status").annotate(n=Count("id")).order_by())


def storage_summary(user, *, project: Project | None = None) -> dict:
    """Storage used (album items and uploaded references) against the user's limit, and
    what starting jobs would reserve under the estimate rule (JOB_STORAGE_ESTIMATE_BYTES
    per pending job). `fits_now` is how many more jobs a start may take; with a project,
    `project_bytes` and `drafts` are its own."""
    from django.conf import settings
    from django.db.models import Sum

    from queue_app.engine import outputs
    from queue_app.models import AlbumItem

    used = outputs.usage_bytes(user.id)  # album items and uploaded references
    limit = outputs.storage_limit(user.id)
    per_job = settings.JOB_STORAGE_ESTIMATE_BYTES
    pending = Job.objects.filter(owner=user, status=Status.PENDING).count()
    reserved = pending * per_job
    summary = {
        "used_bytes": used,
        "reference_bytes": outputs.reference_bytes(user.id),
        "limit_bytes": limit,
        "per_job_bytes": per_job,
        "pending": pending,
        "reserved_bytes": reserved,
        "free_bytes": max(0, limit - used - reserved),
        "fits_now": max(0, (limit - used - reserved) // per_job) if per_job else 10**9,
        "percent": min(100, round(100 * (used + reserved) / limit)) if limit else 100,
    }
    if project is not None:
        drafts = Job.objects.filter(project=project, status=Status.DRAFT).count()
        summary["project_bytes"] = AlbumItem.objects.filter(project=project).aggregate(total=Sum("size"))["total"] or 0
        summary["drafts"] = drafts
        summary["start_all_bytes"] = drafts * per_job
    return summary


PROJECT_CHOICES_LIMIT = 300


def project_choices(user, *, selected: int | None = None) -> list[tuple[int, str]]:
    """(id, name) of the projects a user may filter the monitor by (staff: everyone's),
    by name; the selected one is always among them even past the limit."""
    projects_qs = Project.objects.all() if user.is_staff else Project.objects.filter(owner=user)
    choices = list(projects_qs.filter(archived=False).order_by("name", "id").values_list("id", "name")[:PROJECT_CHOICES_LIMIT])
    if selected is not None and selected not in {project_id for project_id, _ in choices}:
        choices += list(projects_qs.filter(id=selected).values_list("id", "name"))
    return choices


def project_drafts(project):
    """A project's drafts, oldest first (the page pages through them)."""
    return project.jobs.filter(status=Status.DRAFT).select_related("provider").order_by("created_at", "id")


def draft_providers(user, kind: str) -> list:
    """The user's providers whose family makes `kind` outputs (a draft may pick one)."""
    from queue_app.providers.catalogue import CATALOGUE

    return [
        provider
        for provider in Provider.objects.filter(owner=user)
        if any(spec.kind == kind for spec in CATALOGUE.get(provider.family, {}).values())
    ]


def album_images(project, limit: int = 60) -> list:
    """The project's newest album images, for the reference picker."""
    return list(
        AlbumItem.objects.filter(project=project, kind=AlbumItem.ItemKind.IMAGE)
        .exclude(file="")
        .order_by("-created_at", "id")[:limit]
    )


def reference_of(user, sha256: str):
    """An uploaded reference image the user may see (their own; staff: anyone's)."""
    from queue_app.models import Reference

    rows = Reference.objects.all() if user.is_staff else Reference.objects.filter(owner=user)
    return rows.filter(sha256=sha256).first()
