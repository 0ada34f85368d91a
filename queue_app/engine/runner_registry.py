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
and, optionally:
    health(project_ids, now=None) -> {project_id: {...}}   what the pages and the API show about the
                        instance behind each project (one query; see comfy_app/health.py)
"""

RUNNERS: dict = {}


def register(kind: str, runner) -> None:
    RUNNERS[kind] = runner


def kinds() -> list[str]:
    """The project kinds whose jobs are a runner's, not a provider's."""
    return list(RUNNERS)


def health(project_ids, now=None) -> dict:
    """{project_id: health row} from every runner that reports health; {} for none."""
    project_ids = {pid for pid in project_ids if pid is not None}
    rows: dict = {}
    if not project_ids:
        return rows
    for runner in RUNNERS.values():
        report = getattr(runner, "health", None)
        if report is not None:
            rows.update(report(project_ids, now=now))
    return rows
