"""django-q2 task entry points: thin, they load ids and call a service."""

from django.conf import settings
from django.db import transaction
from django_q.tasks import async_task


def _enqueue(func: str, *args) -> None:
    if settings.REDIS_URL:
        # The Redis broker is outside the database transaction: enqueue after commit so
        # a worker never starts on a claim that rolled back.
        transaction.on_commit(lambda: async_task(func, *args))
    else:
        # ORM broker on "default": the task row commits or rolls back with the claim.
        async_task(func, *args)


def enqueue_execution(job_id, token) -> None:
    _enqueue("queue_app.tasks.execute_job", str(job_id), str(token))


def enqueue_collection(job_id, token) -> None:
    _enqueue("queue_app.tasks.collect_job", str(job_id), str(token))


def execute_job(job_id: str, token: str) -> None:
    from queue_app.worker import execute

    execute.run(job_id, token)


def collect_job(job_id: str, token: str) -> None:
    from queue_app.service import poller

    poller.collect(job_id, token)
