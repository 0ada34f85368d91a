"""Handing work to the workers: a django-q2 task, enqueued atomically with the change
that calls for it. The dotted paths name the entry points in `queue_app.tasks` (and
`comfy_app.tasks`), which queued broker rows store."""

from django.conf import settings
from django.db import transaction
from django_q.tasks import async_task


def enqueue_task(func: str, *args) -> None:
    """Enqueue the task `func` (a dotted path) with `args`. Tests capture every task here
    (the `inline_tasks` fixture), so call it through this module, not a copied name."""
    if settings.REDIS_URL:
        # The Redis broker is outside the database transaction: enqueue after commit so
        # a worker never starts on a claim that rolled back.
        transaction.on_commit(lambda: async_task(func, *args))
    else:
        # ORM broker on "default": the task row commits or rolls back with the claim.
        async_task(func, *args)


def enqueue_execution(job_id, token) -> None:
    enqueue_task("queue_app.tasks.execute_job", str(job_id), str(token))


def enqueue_collection(job_id, token) -> None:
    enqueue_task("queue_app.tasks.collect_job", str(job_id), str(token))
