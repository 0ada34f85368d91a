"""What an ambiguous submission does: the provider may have accepted (and billed) the
request, but we hold no task id to find it again — a worker killed between the
provider's acceptance and the stored task id, or a submission whose answer was lost.

Each provider record chooses in its options, `on_ambiguous`:
- "retry": submit again (a second charge is possible);
- "hold":  stop and hold the job for attention — a failed job with error class
           "attention", listed on the monitor as "Needs attention" with Resubmit and
           Mark failed. A visible stuck job beats a silent double charge.
Unset, video projects hold (expensive work) and everything else retries. A family whose
adapter can find the submission again (`find_submitted`: Civitai, Replicate) never holds:
the next attempt looks the task up and adopts it before paying again (engine/reconcile.py).
"""

RETRY = "retry"
HOLD = "hold"
HOLD_BY_DEFAULT = frozenset({"video"})
HOLD_REASON = (
    "needs attention: the provider may have accepted this submission, but no task id was stored "
    "(the worker stopped or the answer was lost). Check the provider's dashboard, then Resubmit or Mark failed."
)


def policy(options: dict | None, kind: str) -> str:
    value = (options or {}).get("on_ambiguous")
    if value in (RETRY, HOLD):
        return value
    return HOLD if kind in HOLD_BY_DEFAULT else RETRY


def reconciled(family: str) -> bool:
    """The family's adapter can look an accepted submission up again."""
    from queue_app.providers import adapter_for
    from queue_app.providers.base import ProviderError

    try:
        return callable(getattr(adapter_for(family), "find_submitted", None))
    except ProviderError:
        return False


def holds(options: dict | None, kind: str, family: str = "") -> bool:
    return policy(options, kind) == HOLD and not (family and reconciled(family))
