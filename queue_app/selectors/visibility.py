"""Who may see what, and who may act on it: the one ownership rule of every door.

Seeing: a user sees their own rows; staff see everyone's (`visible_to`, `may_see`).
Acting: changing a row, starting work billed to its owner, using its secrets — a user acts
on their own rows; on another user's only with the Django permission for it
(`<app>.change_<model>`, or the one a caller names; superusers hold every one). Staff
without permissions are read-only operators: they look, they never act.
"""

from queue_app.engine import budgets
from queue_app.models import Job, Project, Provider


def visible_to(user, model):
    """The rows of `model` (Job, Project, Provider, AlbumItem, Reference: anything with an
    owner) a user may see — their own; staff everyone's."""
    return model.objects.all() if user.is_staff else model.objects.filter(owner=user)


def may_see(user, row) -> bool:
    """`visible_to` for a row already loaded (no query)."""
    return user.is_staff or row.owner_id == user.id


def permission_for(model, action: str = "change") -> str:
    """The Django permission that lets a user act on other users' rows of `model`."""
    return f"{model._meta.app_label}.{action}_{model._meta.model_name}"


def may_act(user, row, *, permission: str | None = None) -> bool:
    """Whether `user` may act on `row`: its owner, or a user holding `permission` (by
    default the change permission of the row's model)."""
    return row.owner_id == user.id or user.has_perm(permission or permission_for(type(row)))


def actable_to(user, model, *, permission: str | None = None):
    """The rows of `model` a user may act on: their own, everyone's with the permission."""
    if user.has_perm(permission or permission_for(model)):
        return model.objects.all()
    return model.objects.filter(owner=user)


def visible_jobs(user):
    """The jobs a user may see: their own; staff see everyone's."""
    return visible_to(user, Job)


def visible_providers(user) -> dict:
    """{id: row} of every provider record the user may see (idle ones too), one query."""
    providers_qs = visible_to(user, Provider)
    rows = {
        row["id"]: row
        for row in providers_qs.values(
            "id", "name", "family", "concurrency", "paused", "paused_reason", "cooldown_until", "created_at", "options"
        )
    }
    for row in rows.values():  # a budget used up stops dispatch: why its jobs wait
        row["budget_reason"] = budgets.blocked(row)
    return rows


def provider_visible(user, provider_id) -> Provider | None:
    """A provider the user may see (their own; staff: anyone's), or None."""
    if isinstance(provider_id, bool) or not isinstance(provider_id, int) or not 1 <= provider_id < 2**63:
        return None
    return visible_to(user, Provider).filter(id=provider_id).first()


def visible_projects(user):
    """The projects a user may see: their own; staff see everyone's (as visible_jobs)."""
    return visible_to(user, Project)
