"""Fair share as the pages tell it: which project holds a full provider's slots, the
reason a queued job of another project is not running yet (engine/fair_share.py decides
who goes next)."""

from collections import Counter

from django.db.models import Count

from queue_app.models import Job, Status


def slot_holders(provider_ids) -> dict[int, Counter]:
    """{provider id: Counter(project name → slots held)} over these providers' processing
    jobs (at most their limits' worth of rows, one grouped query)."""
    holders: dict[int, Counter] = {}
    rows = (
        Job.objects.filter(status=Status.PROCESSING, active_provider_id__in=list(provider_ids))
        .values_list("active_provider_id", "project__name")
        .annotate(n=Count("id"))
        .order_by()
    )
    for provider_id, name, n in rows:
        holders.setdefault(provider_id, Counter())[name] = n
    return holders


def note(*, concurrency: int, holders: Counter | None, contending: bool = True) -> str:
    """'fair share: project X is using 3 of 4 slots' when the provider's slots are all
    held and projects contend for them ('' otherwise): the biggest holder is named."""
    if not holders or not contending or sum(holders.values()) < concurrency:
        return ""
    name, n = max(holders.items(), key=lambda item: (item[1], item[0]))
    return f"fair share: project {name} is using {n} of {concurrency} slots"


def job_note(providers: dict, provider_id, project_name: str) -> str:
    """The note for a queued job of `project_name` on a provider of `providers`
    (visible_providers), when another project holds some of its slots. The holders of
    every provider are read at the first such job: a page costs one query at most."""
    provider = providers.get(provider_id)
    if not provider:
        return ""
    if "slot_holders" not in provider:
        held = slot_holders(providers)
        for pid, row in providers.items():
            row["slot_holders"] = held.get(pid, Counter())
    holders = provider["slot_holders"]
    contending = any(name != project_name for name in holders)
    return note(concurrency=provider["concurrency"], holders=holders, contending=contending)
