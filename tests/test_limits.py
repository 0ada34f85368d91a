"""Limits at every door (issue 18 §2) — the part that does not wait for queue_app/limits.py:
nothing in dispatch costs time or memory in proportion to a configured number instead of
real rows."""

import tracemalloc

import pytest

from queue_app.engine import dispatch
from queue_app.models import Job, Provider, Status
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


@pytest.mark.timeout(120)
def test_dispatch_under_a_huge_concurrency_costs_what_its_jobs_cost(owner, monkeypatch):
    provider = make_provider(owner, concurrency=1)
    Provider.objects.filter(id=provider.id).update(paused=True)  # nothing dispatches while we set up
    project = make_project(owner, provider)
    make_drafts(project, 3)
    jobs_start(user=owner, project=project, all_drafts=True)
    # The database now refuses a concurrency above limits.CONCURRENCY, so the row is read
    # back as if it held the largest value the column holds on every database (dispatch
    # used to build a list of this many slot numbers while holding the provider lock):
    # its cost must not depend on the declared limit either.
    Provider.objects.filter(id=provider.id).update(paused=False)
    from_db = Provider.from_db.__func__

    def inflated(cls, db, field_names, values):
        row = from_db(cls, db, field_names, values)
        if "concurrency" in row.__dict__:
            row.concurrency = 2**31 - 1
        return row

    monkeypatch.setattr(Provider, "from_db", classmethod(inflated))
    tracemalloc.start()
    try:
        claimed = dispatch.dispatch(provider.id)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(claimed) == 3
    assert sorted(Job.objects.filter(status=Status.PROCESSING).values_list("slot", flat=True)) == [0, 1, 2]
    assert peak < 5 * 1024 * 1024, peak


def test_claims_never_pass_a_lowered_limit_while_higher_slots_are_held(owner):
    provider = make_provider(owner, concurrency=3)
    Provider.objects.filter(id=provider.id).update(paused=True)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 4)
    jobs_start(user=owner, project=project, all_drafts=True)
    Provider.objects.filter(id=provider.id).update(paused=False)
    assert len(dispatch.dispatch(provider.id)) == 3
    Job.objects.filter(slot=0).update(status=Status.COMPLETED, slot=None, active_provider=None)
    Provider.objects.filter(id=provider.id).update(concurrency=2)  # slots 1 and 2 still held
    assert dispatch.dispatch(provider.id) == []
    assert Job.objects.filter(id__in=[j.id for j in jobs], status=Status.PENDING).count() == 1
