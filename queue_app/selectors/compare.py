"""The album's compare view (issue 29): a project's outputs side by side by provider,
one row a prompt, one column a provider record and model. Paged by prompt, newest first,
so a project of thousands of items reads one page of rows."""

from django.db.models import Max

from queue_app.models import AlbumItem

ROWS_PER_PAGE = 20


def column_of(item) -> tuple[str, str]:
    """(provider name, model) an item was made with: the job's resolved snapshot, written
    at claim; else what the draft named."""
    job = item.job
    resolved = (job.resolved or {}) if job else {}
    provider = resolved.get("provider_name") or (job.provider.name if job and job.provider else "")
    model = resolved.get("model") or (job.model if job else "") or item.project.model
    return provider or (item.project.provider.name if item.project.provider else "—"), model or "default"


def compare_page(project, page: int = 1) -> dict:
    """{"columns": [(provider, model)], "rows": [{"prompt", "cells": [[items]]}], "page",
    "has_next"}: the page's prompts, each with its main outputs per column."""
    start = (max(page, 1) - 1) * ROWS_PER_PAGE
    mains = AlbumItem.objects.filter(project=project, role__in=("main", "composite"))
    prompts = list(
        mains.values("prompt").annotate(last=Max("created_at")).order_by("-last", "prompt")[start : start + ROWS_PER_PAGE + 1]
    )
    has_next = len(prompts) > ROWS_PER_PAGE
    prompts = [row["prompt"] for row in prompts[:ROWS_PER_PAGE]]
    items = mains.filter(prompt__in=prompts).select_related("job__provider", "project__provider").order_by("created_at", "id")
    by_prompt: dict[str, dict] = {prompt: {} for prompt in prompts}
    columns: dict[tuple, None] = {}
    for item in items:
        column = column_of(item)
        columns[column] = None
        by_prompt[item.prompt].setdefault(column, []).append(item)
    ordered = sorted(columns)
    rows = [{"prompt": prompt, "cells": [by_prompt[prompt].get(column, []) for column in ordered]} for prompt in prompts]
    return {"columns": ordered, "rows": rows, "page": max(page, 1), "has_next": has_next}
