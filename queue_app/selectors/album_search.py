"""The album to find things in (issue 29): a user's album items filtered by project,
provider record, model, kind, date, favourites and prompt words, newest first, paged by
key (`before`: the last id of the previous page), so page 200 costs what page 1 does."""

from dataclasses import dataclass, field
from datetime import date

from django.db.models import Q

from queue_app.models import AlbumItem
from queue_app.selectors.visibility import visible_to

PER_PAGE = 48
MAX_WORDS = 8


@dataclass
class AlbumFilter:
    project: int | None = None
    provider: int | None = None
    model: str = ""
    kind: str = ""
    since: date | None = None
    until: date | None = None
    favourite: bool = False
    words: list[str] = field(default_factory=list)


def album_filtered(user, wanted: AlbumFilter):
    """The user's album items (staff: everyone's) that match every given filter."""
    rows = visible_to(user, AlbumItem).exclude(role="layer")
    if wanted.project:
        rows = rows.filter(project_id=wanted.project)
    if wanted.provider:
        # a job on the project's provider names none of its own
        rows = rows.filter(
            Q(job__provider_id=wanted.provider) | Q(job__provider__isnull=True, project__provider_id=wanted.provider)
        )
    if wanted.model:
        rows = rows.filter(Q(job__resolved__model=wanted.model) | Q(job__resolved__isnull=True, job__model=wanted.model))
    if wanted.kind:
        rows = rows.filter(kind=wanted.kind)
    if wanted.since:
        rows = rows.filter(created_at__date__gte=wanted.since)
    if wanted.until:
        rows = rows.filter(created_at__date__lte=wanted.until)
    if wanted.favourite:
        rows = rows.filter(favourite=True)
    for word in wanted.words[:MAX_WORDS]:
        rows = rows.filter(prompt__icontains=word)
    return rows


def album_page(user, wanted: AlbumFilter, before: int | None = None) -> dict:
    """One page of matching items, newest first: {"items", "next_before"}."""
    rows = album_filtered(user, wanted)
    if before:
        rows = rows.filter(id__lt=before)
    items = list(rows.select_related("project", "job__provider").order_by("-id")[: PER_PAGE + 1])
    more = len(items) > PER_PAGE
    items = items[:PER_PAGE]
    return {"items": items, "next_before": items[-1].id if more else None}
