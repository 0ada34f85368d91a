"""The monitor's search box: which jobs a text finds.

A job matches by a word of its prompt (a plain case-insensitive contains on every
database: at 100,000 jobs a PostgreSQL sequential scan of the prompts stays in the tens of
milliseconds, and a trigram index would cost every insert for little), by its id (the full
UUID, or the 8-character short id the pages show) or by its remote task id (exact).
"""

import re
import uuid

from django.db.models import Q

SHORT_ID = re.compile(r"[0-9a-fA-F]{8}")
MAX_SEARCH = 200


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
