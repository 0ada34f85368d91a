"""django-q2 task entry points of the ComfyUI runner: thin, they load ids and call the
runner. Their dotted paths are stored in queued broker rows: keep them."""


def submit_prompt(job_id: str, token: str) -> None:
    from comfy_app.runner import submit

    submit.submit_prompt(job_id, token)


def collect_prompt(job_id: str, token: str) -> None:
    from comfy_app.runner import collect

    collect.collect_prompt(job_id, token)


# The names these had until issue 11 (queue_app.tasks.collect_job is the provider jobs'
# collection): broker rows queued before an upgrade still name them.
submit_job = submit_prompt
collect_job = collect_prompt
