"""The derived job states (ARCHITECTURE "Job states"), each defined once: its SQL condition
beside its Python predicate, so the job list's filter, a row's state and the queue's
counts cannot disagree.

Pending splits into Waiting (paused, cooling down, backoff, no provider, nobody alive to
take it; with its reason) and Queued; processing into Running, Stalled and Detached;
failed by a user's cancel reads Cancelled. Keep each SQL/Python pair together when a rule
changes: tests/test_status.py::test_every_filter_state_counts_what_its_rows_say checks them.
"""

from django.db.models import Case, CharField, Q, Value, When
from django.db.models.functions import Coalesce

from queue_app.engine import runner_registry
from queue_app.models import ErrorClass, Status

# --- Which provider's queue a job is in --------------------------------------------------
# The slot it holds while processing, else its own provider, else its project's.


def effective_provider_sql():
    return Case(
        When(status=Status.PROCESSING, then="active_provider_id"),
        default=Coalesce("provider_id", "project__provider_id"),
    )


def effective_provider(job) -> int | None:
    return effective_provider_of(
        status=job.status,
        active_provider_id=job.active_provider_id,
        provider_id=job.provider_id,
        project_provider_id=job.project.provider_id,
    )


def effective_provider_of(*, status, active_provider_id, provider_id, project_provider_id) -> int | None:
    """`effective_provider` from the bare columns (queue_status groups by them and joins
    the project's provider in Python: the join to projects was a third of its query)."""
    if status == Status.PROCESSING:
        return active_provider_id
    return provider_id or project_provider_id


# --- Retry backoff -------------------------------------------------------------------------


def in_backoff_sql(now) -> Q:
    return Q(not_before__gt=now)


def in_backoff(not_before, now) -> bool:
    return bool(not_before and not_before > now)


# --- Processing: Detached, Stalled, Running -----------------------------------------------
# Exclusive conditions on a processing job, in the order the Python predicate tests them.


def _processing_conditions(now) -> dict[str, Q]:
    return {
        "detached": ~Q(task_id=""),
        "stalled": Q(task_id="", lease_expires_at__lt=now),
        "running": Q(task_id="") & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__gte=now)),
    }


def processing_state_sql(now):
    """The sub-state of a processing row as an annotation ('' for other statuses)."""
    return Case(
        *[
            When(Q(status=Status.PROCESSING) & condition, then=Value(state))
            for state, condition in _processing_conditions(now).items()
        ],
        default=Value(""),
        output_field=CharField(),
    )


def processing_state(*, task_id: str, lease_expires_at, now) -> str:
    if task_id:
        return "detached"
    if lease_expires_at and lease_expires_at < now:
        return "stalled"
    return "running"


STALLED_REASON = "lease expired; the next heal returns it to pending"


def runner_aware(state: str, kind: str) -> str:
    """A runner's prompt id is no detached task: the runner drives it, so it reads running."""
    return "running" if state == "detached" and kind in runner_registry.RUNNERS else state


# --- Pending: Waiting (and why) or Queued -------------------------------------------------
# Both sides read the same facts: the visible providers ({id: row}), liveness, now.


def waits_sql(*, providers: dict, live: dict, now) -> Q:
    """A pending job nothing will dispatch now; needs the `eff_provider` annotation."""
    runner_kinds = list(runner_registry.RUNNERS)
    blocked = [
        pid
        for pid, p in providers.items()
        if p["paused"] or (p["cooldown_until"] and p["cooldown_until"] > now) or p.get("budget_reason")
    ]
    if live["workers"]:
        provider_waits = (
            Q(eff_provider__isnull=True)
            | ~Q(eff_provider__in=list(providers))
            | Q(eff_provider__in=blocked)
            | in_backoff_sql(now)
        )
    else:
        provider_waits = Q(pk__isnull=False)  # nothing dispatches without a worker
    runner_waits = Q(pk__isnull=False) if not live["queue_services"] else Q(pk__isnull=True)
    return (Q(project__kind__in=runner_kinds) & runner_waits) | (~Q(project__kind__in=runner_kinds) & provider_waits)


def waiting_reason(*, provider: dict | None, kind: str, backoff: bool, live: dict, now, backoff_until=None) -> str:
    """Why a pending job would not be dispatched right now ('' when it is Queued)."""
    if kind in runner_registry.RUNNERS:
        return "" if live["queue_services"] else "no live queue service"
    if provider is None:
        return "no provider"
    if provider["paused"]:
        return f"provider paused: {provider['paused_reason']}" if provider.get("paused_reason") else "provider paused"
    if provider["cooldown_until"] and provider["cooldown_until"] > now:
        return f"cooling down until {provider['cooldown_until']:%H:%M:%S}"
    if provider.get("budget_reason"):
        return provider["budget_reason"]
    if backoff:
        return f"backoff until {backoff_until:%H:%M:%S}" if backoff_until else "retry backoff"
    if not live["workers"]:
        return "no live worker"
    return ""


REASON_CODES = (
    ("provider paused", "paused"),
    ("cooling down", "cooling_down"),
    ("budget", "budget"),
    ("backoff", "backoff"),
    ("retry backoff", "backoff"),
    ("no live worker", "no_worker"),
    ("no live queue service", "no_queue_service"),
    ("no provider", "no_provider"),
)


def reason_code(reason: str) -> str:
    """A waiting reason as a short fixed code (a Prometheus label): "dispatchable" when
    nothing blocks the job but a free slot and the next dispatch."""
    if not reason:
        return "dispatchable"
    return next((code for prefix, code in REASON_CODES if reason.startswith(prefix)), "other")


# --- One state by name ---------------------------------------------------------------------


def condition(state: str, *, providers: dict, live: dict, now) -> Q:
    """The SQL condition of a job-list filter state (derived or stored); needs `eff_provider`."""
    if state in ("waiting", "queued"):
        waits = waits_sql(providers=providers, live=live, now=now)
        return Q(status=Status.PENDING) & (waits if state == "waiting" else ~waits)
    processing = _processing_conditions(now)
    runner = Q(project__kind__in=list(runner_registry.RUNNERS))
    if state == "detached":
        return Q(status=Status.PROCESSING) & processing[state] & ~runner
    if state == "running":
        return Q(status=Status.PROCESSING) & (processing[state] | (processing["detached"] & runner))
    if state in processing:
        return Q(status=Status.PROCESSING) & processing[state]
    if state == "cancelled":
        return Q(status=Status.FAILED, error_class=ErrorClass.CANCELLED)
    if state == "active":
        return Q(status__in=(Status.PENDING, Status.PROCESSING, Status.FAILED))
    if state in Status.values:
        return Q(status=state)
    return Q()


def of_job(job, *, providers: dict, live: dict, now) -> tuple[str, str]:
    """(derived state, why it waits) of one job; the job needs its project loaded."""
    if job.status == Status.PENDING:
        reason = waiting_reason(
            provider=providers.get(effective_provider(job)),
            kind=job.project.kind,
            backoff=in_backoff(job.not_before, now),
            live=live,
            now=now,
            backoff_until=job.not_before,
        )
        return ("waiting", reason) if reason else ("queued", "")
    if job.status == Status.PROCESSING:
        state = processing_state(task_id=job.task_id, lease_expires_at=job.lease_expires_at, now=now)
        state = runner_aware(state, job.project.kind)
        return state, STALLED_REASON if state == "stalled" else ""
    if job.status == Status.FAILED and job.error_class == ErrorClass.CANCELLED:
        return "cancelled", ""
    return job.status, ""
