"""Runners for project kinds that have no provider record (ComfyUI).

`comfy_app` registers itself here; the dispatcher, the queue service and the recovery
scan consult this registry, so `queue_app` never imports `comfy_app`.

A runner object offers:
    wake(project_ids)   pending work appeared for these projects
    tick() -> bool      one step of the runner's timer (the queue service calls it)
    recover() -> int    the recovery scan's share: adopt in-flight work after a restart
    owns(job) -> bool   whether a processing job is the runner's (healing leaves it alone)
"""

RUNNERS: dict = {}


def register(kind: str, runner) -> None:
    RUNNERS[kind] = runner
