"""The Spend page: what the ledger says each provider record and project cost
(selectors/spend.py, docs/money.md)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from queue_app.selectors.spend import period_starts, spend_by


@login_required
def spend(request):
    day, month = period_starts()
    context = {"providers": spend_by(request.user, "provider_id"), "projects": spend_by(request.user, "project_id")}
    return render(request, "queue_app/spend.html", {**context, "day": day, "month": month})
