"""What starting jobs would cost, before Start: each job resolved as a claim would resolve
it (engine/snapshot.py) and priced by its provider record (providers/prices.py), summed
per provider record and currency. A job whose price is unknown is counted as unknown,
never as 0 (docs/money.md)."""

import json
from decimal import Decimal

from queue_app.engine import snapshot
from queue_app.models import Job, Provider, Status
from queue_app.providers.prices import job_cost, price_for, record_currency

# An estimate reads at most this many jobs (a start takes at most as many in one go
# through the page); past it, the answer says it is partial.
ESTIMATE_LIMIT = 5000


# The job fields a snapshot reads (engine/snapshot.build): jobs alike in these (and in their
# provider record) share one resolved price, whatever their prompts.
SNAPSHOT_FIELDS = ("model", "aspect_ratio", "quality", "resolution", "format", "background", "duration", "sound")


def job_estimate(job, project, provider):
    """One job's Cost (amount None: unknown) with the settings a claim now would use."""
    if provider is None:
        return None, {}
    settings, price, currency = _priced(job, project, provider)
    return job_cost(price, settings, prompt=job.prompt, currency=currency), settings


def _priced(job, project, provider) -> tuple[dict, object, str]:
    settings = snapshot.build(job, project, provider)
    base = (provider.model_aliases or {}).get(settings["model"]) or ""
    price = price_for(provider.family, settings["model"], provider.options, base_model=base)
    return settings, price, record_currency(provider.family, provider.options)


def _alike(job, provider) -> tuple:
    params = json.dumps(job.params or {}, sort_keys=True, default=str)
    return (provider.id, *(getattr(job, name) for name in SNAPSHOT_FIELDS), params)


def start_estimate(project, *, job_ids=None, statuses=(Status.DRAFT,)) -> dict:
    """The cost of starting the project's drafts (or the chosen `job_ids` among its drafts
    and failed jobs): {"jobs", "partial", "by_provider": [{provider_id, provider_name,
    currency, amount, jobs, unknown}], "totals": {currency: amount}, "unknown"}; amounts are
    decimal strings, `amount` null when no job of that row has a known price."""
    jobs = Job.objects.filter(project=project).order_by("created_at", "id")
    if job_ids is not None:
        jobs = jobs.filter(id__in=list(job_ids), status__in=(Status.DRAFT, Status.FAILED))
    else:
        jobs = jobs.filter(status__in=statuses)
    jobs = list(jobs.only("id", "provider_id", "prompt", "params", *SNAPSHOT_FIELDS)[: ESTIMATE_LIMIT + 1])
    partial = len(jobs) > ESTIMATE_LIMIT
    jobs = jobs[:ESTIMATE_LIMIT]
    providers = {p.id: p for p in Provider.objects.filter(id__in={j.provider_id or project.provider_id for j in jobs})}
    rows: dict = {}
    priced: dict = {}  # a batch of drafts is mostly alike: each kind is resolved once
    for job in jobs:
        provider = providers.get(job.provider_id or project.provider_id)
        cost = None
        if provider is not None:
            key = _alike(job, provider)
            if key not in priced:
                priced[key] = _priced(job, project, provider)
            settings, price, currency = priced[key]
            cost = job_cost(price, settings, prompt=job.prompt, currency=currency)
        key = (provider.id if provider else None, cost.currency if cost else "")
        row = rows.setdefault(key, _row(provider, key[1]))
        row["jobs"] += 1
        if cost is None or cost.amount is None:
            row["unknown"] += 1
        else:
            row["sum"] += cost.amount
            row["known"] += 1
    return _summary(rows, len(jobs), partial)


def _row(provider, currency) -> dict:
    return {
        "provider_id": provider.id if provider else None,
        "provider_name": provider.name if provider else "no provider",
        "currency": currency,
        "jobs": 0,
        "known": 0,
        "unknown": 0,
        "sum": Decimal(0),
    }


def _summary(rows: dict, count: int, partial: bool) -> dict:
    totals: dict = {}
    by_provider = []
    for row in rows.values():
        known = row.pop("known")
        total = row.pop("sum")
        row["amount"] = money(total) if known else None
        if known:
            totals[row["currency"]] = totals.get(row["currency"], Decimal(0)) + total
        by_provider.append(row)
    return {
        "jobs": count,
        "partial": partial,
        "by_provider": by_provider,
        "totals": {currency: money(amount) for currency, amount in totals.items()},
        "unknown": sum(row["unknown"] for row in by_provider),
    }


def money(amount: Decimal) -> str:
    """A sum as the pages and the API show it: cents, or finer when it is below a cent."""
    if amount and abs(amount) < Decimal("0.01"):
        return str(amount.normalize())
    return str(amount.quantize(Decimal("0.01")))
