"""Who may see what: the one ownership filter (visible_to / may_see) and the visible_* helpers."""

from queue_app.models import Job, Project, Provider


def visible_to(user, model):
    """The one ownership rule: the rows of `model` (Job, Project, Provider, AlbumItem:
    anything with an owner) a user may see and change — their own; staff everyone's."""
    return model.objects.all() if user.is_staff else model.objects.filter(owner=user)


def may_see(user, row) -> bool:
    """`visible_to` for a row already loaded (no query)."""
    return user.is_staff or row.owner_id == user.id


def visible_jobs(user):
    """The jobs a user may see: their own; staff see everyone's."""
    return visible_to(user, Job)


def visible_providers(user) -> dict:
    """{id: row} of every provider record the user may see (idle ones too), one query."""
    providers_qs = visible_to(user, Provider)
    return {
        row["id"]: row
        for row in providers_qs.values(
            "id", "name", "family", "concurrency", "paused", "paused_reason", "cooldown_until", "created_at"
        )
    }


def provider_visible(user, provider_id) -> Provider | None:
    """A provider the user may see (their own; staff: anyone's), or None."""
    if isinstance(provider_id, bool) or not isinstance(provider_id, int) or not 1 <= provider_id < 2**63:
        return None
    providers_qs = Provider.objects.all() if user.is_staff else Provider.objects.filter(owner=user)
    return providers_qs.filter(id=provider_id).first()


def visible_projects(user):
    """The projects a user may see: their own; staff see everyone's (as visible_jobs)."""
    return Project.objects.all() if user.is_staff else Project.objects.filter(owner=user)
