"""The ledger (issue 27): a reservation per claim, made in the claim's transaction, ended
exactly once whatever ends the claim and however often, by the documented policy."""

from decimal import Decimal

import pytest
from django.utils import timezone

from queue_app.engine import attempts, ledger, transitions
from queue_app.models import Charge, ErrorClass, Job, Status
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)

State = Charge.State


@pytest.fixture
def priced(owner):
    """A demo record that pays 0.04 USD a job."""
    provider = make_provider(owner, prices={"*": "0.04"})
    return make_project(owner, provider)


def started(owner, project, n=1):
    """Drafts started, and claimed by the start's wake."""
    jobs = make_drafts(project, n)
    jobs_start(user=owner, project=project, all_drafts=True)
    return jobs


def lines(job):
    return list(Charge.objects.filter(job_id=job.id).order_by("created_at", "id"))


def test_a_claim_reserves_its_estimate_in_the_claims_transaction(owner, priced, inline_tasks):
    [job] = started(owner, priced)
    [(job_id, token)] = inline_tasks.executions()
    [line] = lines(job)
    assert (line.state, line.reserved, line.currency, str(line.claim_token)) == (State.RESERVED, Decimal("0.04"), "USD", token)
    assert (line.provider_id, line.project_id, line.owner_id) == (priced.provider_id, priced.id, owner.id)


def test_a_completed_job_is_settled_once_at_its_estimate(owner, priced, inline_tasks):
    [job] = started(owner, priced)
    inline_tasks.run()
    [line] = lines(job)
    assert (line.state, line.amount, line.source) == (State.SETTLED, Decimal("0.04"), "estimate")
    assert line.ended_at is not None
    # whoever tries again, and with whatever figure, settles nothing more
    assert ledger.end(job.id, submitted=True, reported=Decimal("9")) == 0
    assert Charge.objects.get(id=line.id).amount == Decimal("0.04")


def test_settling_twice_settles_once_and_the_providers_figure_wins(owner, priced, inline_tasks):
    [job] = started(owner, priced)
    [(job_id, token)] = inline_tasks.executions()
    assert transitions.job_complete(job_id, token, cost=Decimal("0.031")) is True
    assert transitions.job_complete(job_id, token, cost=Decimal("0.05")) is False  # fenced: the claim is over
    assert ledger.end(job_id, submitted=False) == 0
    [line] = lines(job)
    assert (line.state, line.amount, line.source) == (State.SETTLED, Decimal("0.031"), "provider")


def expire_and_heal(job):
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timezone.timedelta(seconds=1))
    return transitions.jobs_heal([job.id], reason="its worker died")


def test_a_killed_workers_reservation_is_released_or_held_once(owner, priced, inline_tasks):
    [job] = started(owner, priced)
    # the claim's worker never began (killed before taking the lease): nothing was called
    assert expire_and_heal(job) == [job.id]
    # the heal woke dispatch: the next claim reserves anew, and its worker dies mid-call
    token = inline_tasks.executions()[-1][1]
    assert attempts.attempt_begin(Job.objects.get(id=job.id), token) is not None
    assert expire_and_heal(job) == [job.id]
    first, second, third = lines(job)
    assert (first.state, first.amount) == (State.RELEASED, Decimal(0))
    assert (second.state, second.amount) == (State.HELD, Decimal("0.04")) and "possibly charged" in second.reason
    assert third.state == State.RESERVED  # the third claim: the job's only live reservation
    # a later heal, a cancel, a completion: none touches the ended lines again
    assert transitions.jobs_heal([job.id], reason="again") == []
    transitions.jobs_cancel([job.id])
    assert [(line.state, line.amount, line.ended_at) for line in lines(job)[:2]] == [
        (first.state, first.amount, first.ended_at),
        (second.state, second.amount, second.ended_at),
    ]
    assert lines(job)[2].state == State.RELEASED  # cancelled before its worker began


@pytest.mark.parametrize(
    "fail_kind, state",
    [("permanent", State.RELEASED), ("transient", State.RELEASED), ("ambiguous", State.HELD)],
)
def test_a_failure_ends_its_claim_by_the_policy(owner, inline_tasks, fail_kind, state, settings):
    settings.BACKOFF_BASE_SECONDS = 3600  # a retried job waits: one claim to look at
    provider = make_provider(owner, prices={"*": "0.04"}, fail_rate=1, fail_kind=fail_kind, on_ambiguous="retry")
    project = make_project(owner, provider)
    [job] = started(owner, project)
    inline_tasks.run()
    [line] = lines(job)
    assert line.state == state, line.reason
    assert line.amount == (Decimal(0) if state == State.RELEASED else Decimal("0.04"))


def test_cancelling_a_job_during_its_call_holds_it_as_possibly_charged(owner, priced, inline_tasks):
    [job] = started(owner, priced)
    [(job_id, token)] = inline_tasks.executions()
    attempts.attempt_begin(Job.objects.get(id=job_id), token)
    assert len(transitions.jobs_cancel([job_id])) == 1
    [line] = lines(job)
    assert line.state == State.HELD and "cancelled" in line.reason
    assert Job.objects.get(id=job_id).status == Status.FAILED


def test_a_cancel_after_the_provider_took_the_task_settles_it(owner, priced, inline_tasks):
    [job] = started(owner, priced)
    [(job_id, token)] = inline_tasks.executions()
    Job.objects.filter(id=job_id).update(task_id="remote-1")
    transitions.jobs_cancel([job_id])
    [line] = lines(job)
    assert (line.state, line.amount) == (State.SETTLED, Decimal("0.04"))


def test_an_unknown_price_is_reserved_as_unknown_not_zero(owner, inline_tasks):
    provider = make_provider(owner, currency="EUR")  # the demo's defaults are in USD
    project = make_project(owner, provider)
    [job] = started(owner, project)
    inline_tasks.run()
    [line] = lines(job)
    assert (line.state, line.reserved, line.amount, line.currency) == (State.SETTLED, None, None, "EUR")


def test_every_policy_entry_ends_in_a_final_state():
    for (error_class, _), (state, reason) in ledger.POLICY.items():
        assert error_class in ("", *ErrorClass.values) and state in (State.SETTLED, State.RELEASED, State.HELD)
        assert reason


def test_the_spend_page_and_the_job_page_show_the_ledger(owner, inline_tasks, client):
    project = make_project(owner, make_provider(owner, prices={"*": "0.04"}, concurrency=2))
    done, cut = started(owner, project, 2)
    (_, first), (_, second) = inline_tasks.executions()
    attempts.attempt_begin(Job.objects.get(id=cut.id), second)
    transitions.jobs_cancel([cut.id])  # cancelled during its call: possibly charged
    inline_tasks.run()  # the first completes: settled at 0.04
    client.force_login(owner)
    page = client.get("/spend/").content.decode()
    row = page[page.index(f'data-row="{project.provider_id}-USD"') :]
    assert '<td data-col="today">0.08</td>' in row and '<td data-col="held">0.04' in row
    job_page = client.get(f"/jobs/{done.id}/").content.decode()
    assert 'data-charge="settled"' in job_page and "0.04 USD" in job_page
    assert "possibly charged" in client.get(f"/jobs/{cut.id}/").content.decode()


def test_metrics_count_spend_and_the_csv_lists_every_line(owner, inline_tasks, client):
    from prometheus_client.parser import text_string_to_metric_families

    from queue_app.web.metrics import render_metrics

    project = make_project(owner, make_provider(owner, prices={"*": "0.04"}, concurrency=2))
    done, cut = started(owner, project, 2)
    attempts.attempt_begin(Job.objects.get(id=cut.id), inline_tasks.executions()[1][1])
    transitions.jobs_cancel([cut.id])
    inline_tasks.run()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(render_metrics().decode())
        for sample in family.samples
        if sample.name.startswith("rsq_spend")
    }
    labels = {"provider_id": str(project.provider_id), "currency": "USD"}
    assert samples[("rsq_spend_total", tuple(sorted({**labels, "state": "settled"}.items())))] == 0.04
    assert samples[("rsq_spend_total", tuple(sorted({**labels, "state": "held"}.items())))] == 0.04
    client.force_login(owner)
    rows = client.get("/spend/ledger.csv").content.decode().splitlines()
    assert rows[0].startswith("created_at,ended_at,job_id") and len(rows) == 3
    assert {row.split(",")[9] for row in rows[1:]} == {"settled", "held"}
    assert client.get("/spend/ledger.csv?from=yesterday").status_code == 400
    assert client.get("/spend/ledger.csv?from=2026-12-02&to=2026-12-01").status_code == 400
