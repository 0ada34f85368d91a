"""django-q2 task entry points: thin, they load ids and call the worker. Their dotted
paths are stored in queued broker rows: keep them. Enqueueing is `engine.enqueue`."""


def execute_job(job_id: str, token: str) -> None:
    from queue_app.worker import execute

    execute.run(job_id, token)


def collect_job(job_id: str, token: str) -> None:
    from queue_app.worker import collect

    collect.collect_task(job_id, token)
