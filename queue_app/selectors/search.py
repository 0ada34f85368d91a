"""Finding jobs: the monitor's search box, and the ids behind "all N matching".

`search_condition(text)` matches a job by a word of its prompt (a plain case-insensitive
contains on every database: at 100,000 jobs a PostgreSQL sequential scan of the prompts
stays in the tens of milliseconds, and a trigram index would cost every insert for little),
by its id (the full UUID, or the 8-character short id the pages show) or by its remote
task id (exact). `matching_job_ids` pages through `selectors.jobs_page` with the very
filters the list used, so "all N matching" is exactly what the operator saw counted.
"""

import re
import uuid

from django.db.models import Q

SHORT_ID = re.compile(r"[0-9a-fA-F]{8}")
MAX_SEARCH = 200
BULK_LIMIT = 10_000  # "all matching" acts on at most this many jobs per request
BULK_PAGE = 200


def search_condition(text: str) -> Q:
    text = (text or "").strip()[:MAX_SEARCH]
    if not text:
        return Q()
    condition = Q(prompt__icontains=text) | Q(task_id=text)
    try:
        condition |= Q(id=uuid.UUID(text))
    except ValueError:
        if SHORT_ID.fullmatch(text):
            condition |= Q(id__startswith=text.lower())
    return condition


def matching_job_ids(*, user, filters: dict, limit: int = BULK_LIMIT) -> list[str]:
    """The ids of every job the monitor's list matches with `filters` (the keyword
    arguments of jobs_page), newest first, at most `limit`."""
    from queue_app.selectors.queue import jobs_page  # lazy: queue.py imports this module lazily too

    ids: list[str] = []
    page = 1
    while len(ids) < limit:
        chunk = jobs_page(user=user, page=page, per_page=BULK_PAGE, with_attempts=False, count_limit=limit, **filters)
        ids.extend(row["id"] for row in chunk["jobs"])
        if not chunk["has_next"] or chunk["page"] != page:
            break
        page += 1
    return ids[:limit]
