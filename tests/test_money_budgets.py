"""Budgets (issue 27): dispatch claims a job only while its estimate fits the record's daily
and monthly budget; the others wait with "budget: …" as their reason, and a raised budget
starts them at once."""

from decimal import Decimal

import pytest
from django.utils import timezone

from queue_app.engine import budgets, dispatch
from queue_app.models import Charge, Job, Status
from queue_app.selectors import states
from queue_app.selectors.visibility import visible_providers
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_start
from queue_app.services.providers import provider_save
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)
LIVE = {"workers": 1, "queue_services": 1}


def claimed(jobs) -> int:
    return Job.objects.filter(id__in=[job.id for job in jobs]).exclude(status=Status.PENDING).count()


def why_waiting(owner, job) -> tuple[str, str]:
    job = Job.objects.select_related("project").get(id=job.id)
    return states.of_job(job, providers=visible_providers(owner), live=LIVE, now=timezone.now())


def test_dispatch_stops_before_a_monthly_budget_is_crossed_and_says_why(owner, inline_tasks):
    provider = make_provider(owner, concurrency=5, prices={"*": "0.04"}, budget_month=0.10)
    jobs = make_drafts(make_project(owner, provider), 5)
    jobs_start(user=owner, project=jobs[0].project, all_drafts=True)
    assert claimed(jobs) == 2  # 0.08 reserved; a third would make 0.12
    _, resets = budgets.period_start("budget_month", timezone.now())
    state, reason = why_waiting(owner, jobs[4])
    assert state == "waiting" and reason == f"budget: 0.08 of 0.10 USD this month, resets {resets:%-d %b} 00:00 UTC"
    assert states.reason_code(reason) == "budget"
    inline_tasks.run()  # the two complete: settled, and still nothing more fits
    assert Charge.objects.filter(provider_id=provider.id, state="settled").count() == 2 and claimed(jobs) == 2
    # raising the budget wakes dispatch at once
    provider_save(user=owner, provider=provider, data={"options": {"budget_month": 0.20}})
    assert claimed(jobs) == 5  # 0.08 spent + 3 × 0.04 reaches 0.20 exactly, never past it
    assert sum(c.reserved for c in Charge.objects.filter(provider_id=provider.id)) == Decimal("0.20")


def test_a_daily_budget_counts_too_and_no_budget_claims_everything(owner, inline_tasks):
    daily = make_provider(owner, name="Daily", concurrency=4, prices={"*": "0.04"}, budget_day=0.05)
    jobs = make_drafts(make_project(owner, daily), 3)
    jobs_start(user=owner, project=jobs[0].project, all_drafts=True)
    assert claimed(jobs) == 1 and "today" in why_waiting(owner, jobs[2])[1]
    free = make_provider(owner, name="Free", concurrency=4, prices={"*": "0.04"})
    others = make_drafts(make_project(owner, free, name="Other"), 3)
    jobs_start(user=owner, project=others[0].project, all_drafts=True)
    assert claimed(others) == 3 and why_waiting(owner, others[0])[1] == ""


def test_an_unknown_price_is_not_claimed_under_a_budget(owner, inline_tasks):
    provider = make_provider(owner, currency="EUR", budget_month=5)  # no EUR price: unknown
    [job] = make_drafts(make_project(owner, provider))
    jobs_start(user=owner, project=job.project, all_drafts=True)
    assert claimed([job]) == 0
    assert dispatch.dispatch(provider.id) == []


@pytest.mark.parametrize(
    "options, message",
    [({"budget_month": -1}, "Budget a month"), ({"budget_day": "lots"}, "Budget a day"), ({"budget_day": True}, "Budget a day")],
)
def test_bad_budgets_are_refused_with_a_clear_error(owner, options, message):
    provider = make_provider(owner, name="OpenAI", family="openai")
    with pytest.raises(ServiceError, match=message):
        provider_save(user=owner, provider=provider, data={"options": options})


def test_a_budget_below_what_is_reserved_is_refused(owner, inline_tasks):
    provider = make_provider(owner, concurrency=3, prices={"*": "0.04"})
    jobs = make_drafts(make_project(owner, provider), 3)
    jobs_start(user=owner, project=jobs[0].project, all_drafts=True)  # 0.12 reserved
    with pytest.raises(ServiceError, match="below the 0.12"):
        provider_save(user=owner, provider=provider, data={"options": {"budget_day": 0.1}})
    provider_save(user=owner, provider=provider, data={"options": {"budget_day": 0.5}})
