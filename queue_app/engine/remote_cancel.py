"""Cancelling a detached task where it runs, so it stops (and stops billing) once we
have let its job go: after a user's cancel, and after the processing timeout.

Best effort and outside any database transaction: the job has already failed and its
slot is free whatever the provider answers; a failure is logged, never raised. A
provider family offers `cancel(task_id, job)` in its adapter module when its API can
(providers/base.py); a runner (ComfyUI) offers `cancel(job_id=, project_id=, task_id=)`.
"""

import logging
from types import SimpleNamespace

from queue_app import providers
from queue_app.engine import runners
from queue_app.engine.snapshot import resolved_job
from queue_app.models import Provider

log = logging.getLogger(__name__)


def cancel_tasks(rows) -> int:
    """Cancel the remote tasks of cancelled jobs (the rows `transitions.jobs_cancel`
    returned). Returns how many cancel requests were sent and accepted."""
    return sum(
        cancel_task(
            job_id=row["id"],
            project_id=row["project_id"],
            kind=row.get("project__kind") or "",
            provider_id=row.get("active_provider_id"),
            task_id=row.get("task_id") or "",
            resolved=row.get("resolved"),
        )
        for row in rows
        if row.get("task_id")
    )


def cancel_task(*, job_id, project_id, kind: str, provider_id, task_id: str, resolved) -> bool:
    """Ask the provider (or the runner) to cancel one task. True when it was asked and did
    not refuse; False when it cannot cancel or the request failed (logged)."""
    if not task_id:
        return False
    try:
        runner = runners.RUNNERS.get(kind)
        if runner is not None:
            cancel = getattr(runner, "cancel", None)
            if cancel is None:
                return False
            cancel(job_id=job_id, project_id=project_id, task_id=task_id)
            return True
        provider = Provider.objects.filter(id=provider_id).first() if provider_id else None
        if provider is None:
            return False
        adapter = providers.adapter_for(provider.family)
        cancel = getattr(adapter, "cancel", None)
        if cancel is None:
            return False
        request = resolved_job(SimpleNamespace(id=job_id, resolved=resolved or {}, prompt="", references=[]), provider)
        providers.call(request, cancel, task_id, request)
        log.info("job %s: remote task cancelled at %s", job_id, provider.family)
        return True
    except Exception as error:
        reason = getattr(error, "reason", "") or type(error).__name__
        log.warning("job %s: cancelling the remote task failed (%s); it may run on at the provider", job_id, reason)
        return False
