"""Cancelling a detached task where it runs, so it stops (and stops billing) once we
have let its job go: after a user's cancel, and after the processing timeout.

Best effort and outside any database transaction: the job has already failed and its
slot is free whatever the provider answers; a failure is logged, never raised. A
provider family offers `cancel(task_id, job)` in its adapter module when its API can
(providers/base.py); a runner (ComfyUI) offers `cancel(job_id=, project_id=, task_id=)`.
Many tasks (a user cancelling a selection) are cancelled on a few threads at once: the
provider calls are plain HTTP, prepared beforehand, so the threads touch no database.
"""

import logging
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from queue_app import providers
from queue_app.engine import runner_registry
from queue_app.engine.snapshot import resolved_job
from queue_app.models import Provider
from queue_app.providers.base import ProviderError

log = logging.getLogger(__name__)

# Provider cancel calls in flight at once for one batch.
PARALLEL = 8


def cancel_tasks(rows) -> int:
    """Cancel the remote tasks of cancelled jobs (the rows `transitions.jobs_cancel`
    returned). Returns how many cancel requests were sent and not refused."""
    rows = [row for row in rows if row.get("task_id")]
    providers_by_id = Provider.objects.in_bulk({row["active_provider_id"] for row in rows if row.get("active_provider_id")})
    calls, done = [], 0
    for row in rows:
        kind = row.get("project__kind") or ""
        if kind in runner_registry.RUNNERS:
            done += _runner_cancel(kind, row["id"], row["project_id"], row["task_id"])
        else:
            provider = providers_by_id.get(row.get("active_provider_id"))
            call = _provider_call(row["id"], provider, row["task_id"], row.get("resolved"))
            if call is not None:
                calls.append(call)
    if len(calls) <= 1:
        return done + sum(call() for call in calls)
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(calls)), thread_name_prefix="remote-cancel") as pool:
        return done + sum(pool.map(lambda call: call(), calls))


def cancel_task(*, job_id, project_id, kind: str, provider_id, task_id: str, resolved) -> bool:
    """Ask the provider (or the runner) to cancel one task. True when it was asked and did
    not refuse; False when it cannot cancel or the request failed (logged)."""
    if not task_id:
        return False
    if kind in runner_registry.RUNNERS:
        return _runner_cancel(kind, job_id, project_id, task_id)
    provider = Provider.objects.filter(id=provider_id).first() if provider_id else None
    call = _provider_call(job_id, provider, task_id, resolved)
    return call() if call is not None else False


def cancel_provider_task(job, *, provider_id, task_id: str) -> bool:
    """`cancel_task` for a provider family's task of `job` (the request rebuilt from its
    snapshot): after a cancel that raced the submission, and after the processing timeout."""
    return cancel_task(
        job_id=job.id, project_id=job.project_id, kind="", provider_id=provider_id, task_id=task_id, resolved=job.resolved
    )


def _runner_cancel(kind: str, job_id, project_id, task_id: str) -> bool:
    cancel = getattr(runner_registry.RUNNERS[kind], "cancel", None)
    if cancel is None:
        return False
    try:
        cancel(job_id=job_id, project_id=project_id, task_id=task_id)
        return True
    except Exception:
        log.warning("job %s: cancelling the %s task failed; it may run on", job_id, kind, exc_info=True)
        return False


def _provider_call(job_id, provider: Provider | None, task_id: str, resolved):
    """A function that sends the cancel (HTTP only), or None when the family cannot."""
    if provider is None:
        return None
    try:
        cancel = getattr(providers.adapter_for(provider.family), "cancel", None)
    except ProviderError:
        return None
    if cancel is None:
        return None
    request = resolved_job(SimpleNamespace(id=job_id, resolved=resolved or {}, prompt="", references=[]), provider)

    def call() -> bool:
        try:
            providers.call(request, cancel, task_id, request)
        except Exception as error:
            reason = getattr(error, "reason", "") or type(error).__name__
            log.warning("job %s: cancelling the remote task failed (%s); it may run on at the provider", job_id, reason)
            return False
        log.info("job %s: remote task cancelled at %s", job_id, provider.family)
        return True

    return call
