"""The money ledger's writes (docs/money.md): a reservation per claim, inside the claim's
transaction, and its end, exactly once, inside the transaction that ends the claim.

Every end is one compare-and-set UPDATE from `reserved`: a second settlement of the same
claim matches no row, whichever process tries it and whenever. How a claim ends follows
how its job left `processing` (POLICY): completed → settled at the provider's reported
figure, else the estimate; refused or failed at the provider → released; an answer lost
or a worker gone mid-call → held as possibly charged (counted as spent, never settled
twice). An end ends every live line of its job: one whose claim ended unrecorded goes
with the next, never twice.
"""

from decimal import Decimal

from django.db.models import F
from django.utils import timezone

from queue_app.models import Charge, ErrorClass, JobAttempt, Provider
from queue_app.providers.prices import job_cost, price_for, record_currency, reported_cost

State = Charge.State
SETTLED, RELEASED, HELD = State.SETTLED, State.RELEASED, State.HELD

# (error class the job left processing with, whether the provider held a task id for it)
# → how its claim ends. "" is a completion.
POLICY = {
    ("", True): (SETTLED, "completed"),
    ("", False): (SETTLED, "completed"),
    (ErrorClass.PERMANENT, False): (RELEASED, "refused by the provider"),
    (ErrorClass.PERMANENT, True): (RELEASED, "failed at the provider"),
    (ErrorClass.TRANSIENT, False): (RELEASED, "refused by the provider, tried again"),
    (ErrorClass.TRANSIENT, True): (RELEASED, "failed at the provider"),
    (ErrorClass.AMBIGUOUS, False): (HELD, "possibly charged: the answer to the submission was lost"),
    (ErrorClass.AMBIGUOUS, True): (HELD, "possibly charged: the answer was lost"),
    (ErrorClass.ATTENTION, False): (HELD, "possibly charged: held for attention"),
    (ErrorClass.ATTENTION, True): (HELD, "possibly charged: held for attention"),
    (ErrorClass.TIMEOUT, False): (HELD, "possibly charged: timed out during the call"),
    (ErrorClass.TIMEOUT, True): (SETTLED, "timed out at the provider after it took the task"),
    (ErrorClass.LOCAL, False): (HELD, "possibly charged: failed here after the call"),
    (ErrorClass.LOCAL, True): (SETTLED, "the provider did the work; storing it failed here"),
    (ErrorClass.CANCELLED, False): (HELD, "possibly charged: cancelled during the call"),
    (ErrorClass.CANCELLED, True): (SETTLED, "cancelled after the provider took the task"),
}


def reserve(provider: Provider, claims) -> int:
    """One reserved line per claim [(job, snapshot, token)] on `provider`, at the estimate
    (null when its price is unknown). Call in the claim's transaction."""
    if not claims:
        return 0
    currency = record_currency(provider.family, provider.options)
    rows = []
    for job, snap, token in claims:
        model = snap.get("model") or ""
        price = price_for(provider.family, model, provider.options, base_model=snap.get("model_alias_of") or "")
        cost = job_cost(price, snap, prompt=job.prompt, currency=currency)
        rows.append(
            Charge(
                claim_token=token,
                job_id=job.id,
                project_id=job.project_id,
                provider_id=provider.id,
                owner_id=job.owner_id,
                model=model[:200],
                currency=cost.currency,
                unit=cost.unit,
                reserved=cost.amount,
            )
        )
    Charge.objects.bulk_create(rows)
    return len(rows)


def reported(provider: Provider, snapshot: dict | None, usage: dict) -> Decimal | None:
    """The provider's own figure for a finished job run with `snapshot` (prices.reported_cost)."""
    if not usage:
        return None
    snapshot = snapshot or {}
    model, base = snapshot.get("model") or "", snapshot.get("model_alias_of") or ""
    price = price_for(provider.family, model, provider.options, base_model=base)
    return reported_cost(price, usage, record_currency(provider.family, provider.options))


def end(job_id, *, error_class: str = "", submitted: bool, reported: Decimal | None = None) -> int:
    """End the job's live reservation by POLICY; 1 when this call ended it, 0 when there
    was none (never reserved, or ended already). `reported`: the provider's own figure."""
    state, reason = POLICY.get((error_class or "", bool(submitted)), (HELD, f"possibly charged: ended {error_class}"))
    return _end(Charge.objects.filter(job_id=job_id, state=State.RESERVED), state, reason, reported)


def end_left(job_id, fields: dict, *, submitted: bool, reported: Decimal | None = None) -> int:
    """`end` for a job that left processing with these column values (its error class)."""
    ended_as = fields.get("error_class") or ""
    return end(job_id, error_class=ended_as, submitted=submitted, reported=reported)


def end_stalled(job_ids, *, held_reason: str = "possibly charged: its worker stopped during the call") -> int:
    """Claims whose worker is gone (a heal, a stalled job failed or held, a cancel before
    any task id): held as possibly charged where a call was under way (an open attempt),
    released where no worker had begun. Call before their attempts are closed."""
    job_ids = list(job_ids)
    calling = set(JobAttempt.objects.filter(job_id__in=job_ids, finished_at__isnull=True).values_list("job_id", flat=True))
    live = Charge.objects.filter(state=State.RESERVED)
    ended = _end(live.filter(job_id__in=calling), HELD, held_reason, None) if calling else 0
    idle = [job_id for job_id in job_ids if job_id not in calling]
    if idle:
        ended += _end(live.filter(job_id__in=idle), RELEASED, "no call was made: its worker never began", None)
    return ended


def end_cancelled(rows) -> int:
    """Processing jobs cancelled ({"id", "task_id"} rows): by POLICY where the provider took
    the task, else as end_stalled says (held where a call was under way)."""
    ended = sum(end(row["id"], error_class=ErrorClass.CANCELLED, submitted=True) for row in rows if row["task_id"])
    calling = [row["id"] for row in rows if not row["task_id"]]
    return ended + (end_stalled(calling, held_reason="possibly charged: cancelled during the call") if calling else 0)


def _end(lines, state: str, reason: str, reported: Decimal | None) -> int:
    fields = dict(state=state, reason=reason[:300], ended_at=timezone.now())
    if state == RELEASED:
        fields.update(amount=Decimal(0), source="")
    elif state == SETTLED and reported is not None:
        fields.update(amount=reported, source="provider")
    else:
        fields.update(amount=F("reserved"), source="estimate")
    return lines.update(**fields)
