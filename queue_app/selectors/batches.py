"""Reads of the combinations generator: a project's workflow, a user's wildcard lists."""

from queue_app.models import ProjectWorkflow, WildcardList


def workflow_items(project) -> list[dict]:
    """The project's stored workflow items ([] when it has none)."""
    row = ProjectWorkflow.objects.filter(project=project).only("items").first()
    return list(row.items) if row else []


def wildcard_lists(user) -> dict[str, list[str]]:
    """The user's named lists, name → values."""
    return dict(WildcardList.objects.filter(owner=user).values_list("name", "values"))
