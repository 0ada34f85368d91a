"""django-q2 task entry points of the ComfyUI runner: thin, they load ids and call the
runner. Their dotted paths are stored in queued broker rows: keep them."""


def submit_job(job_id: str, token: str) -> None:
    from comfy_app.runner import submit

    submit.submit_prompt(job_id, token)


def collect_job(job_id: str, token: str) -> None:
    from comfy_app.runner import collect

    collect.collect_prompt(job_id, token)
