"""Reads of the combinations generator and of reuse: a project's workflow and recent
prompts, a user's wildcard lists and prompt templates."""

from django.db.models import Max

from queue_app.models import Job, ProjectWorkflow, PromptTemplate, WildcardList


def workflow_items(project) -> list[dict]:
    """The project's stored workflow items ([] when it has none)."""
    row = ProjectWorkflow.objects.filter(project=project).only("items").first()
    return list(row.items) if row else []


def wildcard_lists(user) -> dict[str, list[str]]:
    """The user's named lists, name → values."""
    return dict(WildcardList.objects.filter(owner=user).values_list("name", "values"))


def prompt_templates(user) -> dict[str, str]:
    return dict(PromptTemplate.objects.filter(owner=user).values_list("name", "text"))


def recent_prompts(project, limit: int = 20) -> list[str]:
    """The project's latest distinct prompts, newest first (drafts and jobs alike)."""
    rows = Job.objects.filter(project=project).values("prompt").annotate(last=Max("created_at")).order_by("-last")[:limit]
    return [row["prompt"] for row in rows]
