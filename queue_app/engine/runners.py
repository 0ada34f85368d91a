"""The registry of runners: project kinds whose jobs run without a provider record
(ComfyUI). `comfy_app` registers its runner here on start (comfy_app.apps), so
`queue_app` never imports `comfy_app`.

Dispatch, the detached poller and the recovery scan leave jobs of these kinds to their
runner (`kinds()`); dispatch's wake-ups, the queue service's timer and the recovery scan
call it. A runner object offers:
    wake(project_ids)   pending work appeared for these projects: claim what fits
    tick() -> bool      one step of the runner's timer (the queue service calls it)
    recover() -> int    the recovery scan's share: adopt in-flight work after a restart
    cancel(job_id=, project_id=, task_id=)   optional: stop a cancelled job's remote work
"""

RUNNERS: dict = {}


def register(kind: str, runner) -> None:
    RUNNERS[kind] = runner


def kinds() -> list[str]:
    """The project kinds whose jobs are a runner's, not a provider's."""
    return list(RUNNERS)
