"""What the ledger says was spent (docs/money.md): per provider record or project and
currency, today, this month and in all; settled and possibly charged (held) count as
spent, live reservations apart, released lines not at all. Amounts are decimal strings."""

from datetime import UTC
from decimal import Decimal

from django.db.models import Case, Count, F, Q, Sum, When
from django.utils import timezone

from queue_app.models import Charge, Project, Provider
from queue_app.selectors.estimate import money

State = Charge.State
SPENT = (State.SETTLED, State.HELD)


def period_starts(now=None) -> tuple:
    """The start of today and of this month, UTC."""
    now = now or timezone.now()
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day.replace(day=1)


def spend_by(user, key: str) -> list[dict]:
    """Rows per `key` ("provider_id" or "project_id") and currency of the lines the user
    may see (staff: everyone's): spent today, this month and in all, possibly charged,
    reserved now, and how many lines have no known figure."""
    day, month = period_starts()
    lines = Charge.objects.all() if user.is_staff else Charge.objects.filter(owner_id=user.id)
    spent = Q(state__in=SPENT)
    rows = (
        lines.values(key, "currency")
        .annotate(
            today=Sum("amount", filter=spent & Q(ended_at__gte=day)),
            month=Sum("amount", filter=spent & Q(ended_at__gte=month)),
            total=Sum("amount", filter=spent),
            held=Sum("amount", filter=Q(state=State.HELD)),
            held_n=Count("id", filter=Q(state=State.HELD)),
            reserved_now=Sum("reserved", filter=Q(state=State.RESERVED)),
            live=Count("id", filter=Q(state=State.RESERVED)),
            settled_n=Count("id", filter=Q(state=State.SETTLED)),
            released_n=Count("id", filter=Q(state=State.RELEASED)),
            unknown=Count("id", filter=~Q(state=State.RELEASED) & Q(amount__isnull=True, reserved__isnull=True)),
        )
        .order_by(key, "currency")
    )
    model = Provider if key == "provider_id" else Project
    names = dict(model.objects.filter(id__in={row[key] for row in rows}).values_list("id", "name"))
    result = []
    for row in rows:
        shown = {name: money(row[name] or Decimal(0)) for name in ("today", "month", "total", "held", "reserved_now")}
        counts = {name: row[name] for name in ("held_n", "live", "settled_n", "released_n", "unknown")}
        result.append({"id": row[key], "name": names.get(row[key], "(deleted)"), "currency": row["currency"], **shown, **counts})
    return result


def ledger_totals() -> dict:
    """For /metrics, in one query: {"spent": {(provider_id, currency, state): amount}} of
    ended lines that count as spent (never falls: a line is never deleted, and its amount
    never changes once ended), {"reserved": {(provider_id, currency): amount}} of live claims."""
    figure = Case(When(state=State.RESERVED, then=F("reserved")), default=F("amount"))
    rows = (
        Charge.objects.filter(state__in=(*SPENT, State.RESERVED))
        .values_list("provider_id", "currency", "state")
        .annotate(total=Sum(figure))
        .order_by("provider_id", "currency", "state")
    )
    totals: dict = {"spent": {}, "reserved": {}}
    for provider_id, currency, state, total in rows:
        if total is None:
            continue  # unknown figures only
        if state == State.RESERVED:
            totals["reserved"][(provider_id, currency)] = total
        else:
            totals["spent"][(provider_id, currency, state)] = total
    return totals


def ledger_rows(user, start, end):
    """The lines the user may see (staff: everyone's) claimed from `start` to before `end`,
    oldest first, for the CSV export."""
    lines = Charge.objects.all() if user.is_staff else Charge.objects.filter(owner_id=user.id)
    return lines.filter(created_at__gte=start, created_at__lt=end).order_by("created_at", "id")


def job_lines(job_id) -> list[Charge]:
    """A job's ledger lines, one per claim, oldest first."""
    return list(Charge.objects.filter(job_id=job_id).order_by("created_at", "id"))
