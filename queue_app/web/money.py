"""The Spend page: what the ledger says each provider record and project cost
(selectors/spend.py, docs/money.md)."""

import csv
from datetime import UTC, date, datetime, timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render

from queue_app.selectors.spend import ledger_rows, period_starts, spend_by

CSV_COLUMNS = (
    "created_at", "ended_at", "job_id", "project_id", "provider_id", "model", "currency", "unit", "reserved", "state",
    "amount", "source", "reason",
)  # fmt: skip


@login_required
def spend(request):
    day, month = period_starts()
    context = {"providers": spend_by(request.user, "provider_id"), "projects": spend_by(request.user, "project_id")}
    return render(request, "queue_app/spend.html", {**context, "day": day, "month": month})


@login_required
def ledger_csv(request):
    """GET /spend/ledger.csv?from=YYYY-MM-DD&to=YYYY-MM-DD: the ledger's lines claimed on
    those UTC days (both included; default: this month so far), one row each."""
    try:
        today = datetime.now(UTC).date()
        first = date.fromisoformat(request.GET.get("from") or today.replace(day=1).isoformat())
        last = date.fromisoformat(request.GET.get("to") or today.isoformat())
    except ValueError:
        return HttpResponse("from and to must be dates such as 2026-12-01\n", status=400, content_type="text/plain")
    if last < first or (last - first).days > 366:
        return HttpResponse("to must be on or after from, at most 366 days later\n", status=400, content_type="text/plain")
    start = datetime.combine(first, datetime.min.time(), tzinfo=UTC)
    end = datetime.combine(last + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="ledger-{first}-{last}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_COLUMNS)
    for line in ledger_rows(request.user, start, end).iterator():
        writer.writerow(["" if getattr(line, name) is None else getattr(line, name) for name in CSV_COLUMNS])
    return response
