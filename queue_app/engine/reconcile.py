"""Reconcile before paying again: an attempt whose submission may have reached the
provider without a stored task id (its worker died after the create was sent, or the
answer was ambiguous) left a task the provider may be running and billing. Before the
next attempt submits, it asks the provider for that task — by the earlier attempt's tag
where the family echoes one (Civitai), by input and creation time where it echoes only
those (Replicate) — and adopts it instead of creating another. Families without a lookup
(`find_submitted` in the adapter) submit as before (engine/ambiguous.py: retry or hold).
"""

import time
from datetime import timedelta

from queue_app import providers
from queue_app.models import Job, JobAttempt

Outcome = JobAttempt.Outcome
Phase = JobAttempt.Phase

# How a submit ended when its request may have reached the provider with no id stored.
# LOCAL: failed here, maybe after the provider answered — a synchronous answer whose outputs
# could not be stored (a full media disk) left a finished task to collect, not to pay again.
MAY_HAVE_REACHED = (Outcome.INTERRUPTED, Outcome.LOST, Outcome.AMBIGUOUS, Outcome.LOCAL)
LOOKBACK = 3  # earlier unsettled attempts looked up, newest first
# `since` is this much before the earlier attempt began: the provider's clock is not ours.
CLOCK_MARGIN = timedelta(minutes=2)
# An ambiguous answer's own lookup: tries, and the pause before the next (× the try).
OWN_TRIES = 3
OWN_PAUSE_SECONDS = 0.5


def tag(job_id, number: int) -> str:
    """The unique tag of a job's attempt `number`, sent with its submission."""
    return f"rs-{job_id}-{number}"


def unsettled(job_id, before: int) -> list[tuple[int, object]]:
    """(number, started_at) of the job's earlier attempts that may have created a task at
    the provider whose id was never stored, newest first."""
    rows = JobAttempt.objects.filter(
        job_id=job_id, number__lt=before, phase=Phase.SUBMIT, outcome__in=MAY_HAVE_REACHED, task_id=""
    )
    return list(rows.order_by("-number").values_list("number", "started_at")[:LOOKBACK])


def candidates(adapter, request, job_id, number: int) -> list[str]:
    """Tasks an earlier attempt of this job may have created and nothing holds, newest
    first; empty when there is nothing to adopt (submit). A failed lookup is tried again
    OWN_TRIES times while the job keeps its slot (its lost task may still be running at
    the provider); then the error passes through and the retry asks again."""
    if not callable(getattr(adapter, "find_submitted", None)):
        return []
    found: list[str] = []
    for earlier, started in unsettled(job_id, number):
        ids = _asked(request, adapter.find_submitted, tag(job_id, earlier), started - CLOCK_MARGIN)
        found += [task_id for task_id in ids if task_id not in found]
    return unheld(found)


def _asked(request, find_submitted, attempt_tag: str, since) -> list[str]:
    from queue_app.providers.base import ProviderError

    for n in range(OWN_TRIES):
        try:
            return providers.call(request, find_submitted, request, attempt_tag, since)
        except ProviderError:
            if n + 1 == OWN_TRIES:
                raise
            time.sleep(OWN_PAUSE_SECONDS * (n + 1))
    return []


def own(adapter, request, job_id, attempt) -> list[str]:
    """After an ambiguous answer, this attempt's own task, found at once so that the job
    keeps its slot (a requeue would free it while the task runs at the provider). A failed
    lookup is tried again OWN_TRIES times; then empty, and the next attempt looks again."""
    if not callable(getattr(adapter, "find_submitted", None)):
        return []
    from queue_app.providers.base import ProviderError

    try:
        return unheld(_asked(request, adapter.find_submitted, request.tag, attempt.started_at - CLOCK_MARGIN))
    except ProviderError:
        return []


def unheld(task_ids: list[str]) -> list[str]:
    """The ids no job and no attempt has stored: a task another job holds (or one this job
    stored and saw fail) is not adopted again."""
    if not task_ids:
        return []
    held = set(Job.objects.filter(task_id__in=task_ids).values_list("task_id", flat=True))
    held |= set(JobAttempt.objects.filter(task_id__in=task_ids).values_list("task_id", flat=True))
    return [task_id for task_id in task_ids if task_id not in held]
