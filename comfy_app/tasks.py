"""django-q2 task entry points of the ComfyUI runner: thin, they load ids and call the runner."""


def submit_job(job_id: str, token: str) -> None:
    from comfy_app import runner

    runner.submit(job_id, token)


def collect_job(job_id: str, token: str) -> None:
    from comfy_app import runner

    runner.collect(job_id, token)
