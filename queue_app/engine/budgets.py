"""Budgets per provider record (docs/money.md): a daily and a monthly limit in the record's
currency (options `budget_day`, `budget_month`). Dispatch claims a job only when its
estimate fits what is left of every period's budget: spent (settled and held lines ended
in the period) plus what is reserved now, plus the claims made in this dispatch. A job
whose price is unknown is not claimed on a record with a budget (it could cross it).
Spend can exceed a budget only by what settlements exceeded their reservations."""

from datetime import UTC
from decimal import Decimal

from django.db.models import Q, Sum
from django.utils import timezone

from queue_app.models import Charge
from queue_app.providers.prices import job_cost, price_for, record_currency

PERIODS = (("budget_day", "today"), ("budget_month", "this month"))


def limits(options: dict | None) -> dict:
    """{option name: Decimal limit} of the budgets a record sets."""
    return {name: Decimal(str(options[name])) for name, _ in PERIODS if (options or {}).get(name) is not None}


def period_start(name: str, now) -> tuple:
    """(start, next start) of a budget's period around `now`, UTC."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if name == "budget_day":
        return day, day + timezone.timedelta(days=1)
    month = day.replace(day=1)
    return month, (month + timezone.timedelta(days=32)).replace(day=1)


def used(provider_id: int, name: str, now) -> Decimal:
    """Spent in the period plus reserved now, on one record."""
    start, _ = period_start(name, now)
    spent = Q(state__in=(Charge.State.SETTLED, Charge.State.HELD), ended_at__gte=start)
    totals = Charge.objects.filter(provider_id=provider_id).aggregate(
        spent=Sum("amount", filter=spent), live=Sum("reserved", filter=Q(state=Charge.State.RESERVED))
    )
    return (totals["spent"] or Decimal(0)) + (totals["live"] or Decimal(0))


def reserved_now(provider_id: int) -> Decimal:
    """What the record's live claims hold reserved."""
    live = Charge.objects.filter(provider_id=provider_id, state=Charge.State.RESERVED).aggregate(n=Sum("reserved"))
    return live["n"] or Decimal(0)


def below_reserved(provider_id: int, options: dict) -> str:
    """A refusal when a budget is set below what the record holds reserved now ('' if not)."""
    budget = limits(options)
    held = reserved_now(provider_id) if budget else Decimal(0)
    low = [name for name, limit in budget.items() if limit < held]
    return f"{low[0].replace('_', ' ')} {budget[low[0]]} is below the {held} already reserved by running jobs" if low else ""


def affordable(provider, claims: list) -> tuple[list, str]:
    """The leading claims [(job, slot, snapshot)] whose estimates fit every budget of the
    record, and why the rest wait ('' when none does). No budget: all, at no cost."""
    budget = limits(provider.options)
    if not budget or not claims:
        return claims, ""
    now = timezone.now()
    left = {name: limit - used(provider.id, name, now) for name, limit in budget.items()}
    currency = record_currency(provider.family, provider.options)
    taken = []
    for job, slot, snap in claims:
        price = price_for(provider.family, snap.get("model") or "", provider.options, base_model=snap.get("model_alias_of") or "")
        cost = job_cost(price, snap, prompt=job.prompt, currency=currency).amount
        if cost is None:
            return taken, f"budget: no price for {snap.get('model') or 'the model'}, so it could cross the budget"
        short = next((name for name in left if left[name] < cost), None)
        if short is not None:
            return taken, reason(short, budget[short] - left[short], budget[short], currency, now)
        left = {name: amount - cost for name, amount in left.items()}
        taken.append((job, slot, snap))
    return taken, ""


def reason(name: str, spent: Decimal, limit: Decimal, currency: str, now) -> str:
    """ "budget: 48.70 of 50.00 USD this month, resets 1 Jan 00:00 UTC"."""
    _, resets = period_start(name, now)
    label = dict(PERIODS)[name]
    cents = Decimal("0.01")
    return f"budget: {spent.quantize(cents)} of {limit.quantize(cents)} {currency} {label}, resets {resets:%-d %b %H:%M} UTC"


def blocked(provider_row: dict, now=None) -> str:
    """Why a budgeted record claims nothing now ('' when it may): a period's budget used up
    to less than its last reservation's estimate (the next job's, as far as a read can
    tell). For the pages' why-waiting; dispatch checks each job's own estimate."""
    budget = limits(provider_row.get("options"))
    if not budget:
        return ""
    now = now or timezone.now()
    last = Charge.objects.filter(provider_id=provider_row["id"]).order_by("-id").values_list("reserved", flat=True).first()
    need = last if last is not None else Decimal("0.000001")
    currency = record_currency(provider_row.get("family", ""), provider_row.get("options"))
    for name, limit in budget.items():
        spent = used(provider_row["id"], name, now)
        if limit - spent < need:
            return reason(name, spent, limit, currency, now)
    return ""
