"""Fair share: projects with pending work on one provider share its slots
(engine/fair_share.py); within a project the oldest goes first."""

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import dispatch, enqueue, hot_sql, runner_registry
from queue_app.models import Job, ShareTurn, Status
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr(enqueue, "enqueue_task", lambda *args, **kwargs: None)


def queue(project, n, *, at, **fields):
    jobs = make_drafts(project, n, **fields)
    Job.objects.filter(id__in=[job.id for job in jobs]).update(status=Status.PENDING, queued_at=at)
    return [job.id for job in jobs]


def finish(job_id):
    """The job leaves its slot (as a completion does), without a worker."""
    Job.objects.filter(id=job_id).update(
        status=Status.COMPLETED, active_provider=None, slot=None, lease_token=None, lease_owner="", lease_expires_at=None
    )


def running(provider):
    return Counter(Job.objects.filter(active_provider=provider, status=Status.PROCESSING).values_list("project__name", flat=True))


def test_a_small_batch_behind_a_big_one_starts_within_one_slot_turnover(owner):
    provider = make_provider(owner, concurrency=4)
    big, small = make_project(owner, provider, name="big"), make_project(owner, provider, name="small")
    now = timezone.now()
    big_ids = queue(big, 300, at=now - timedelta(minutes=10))
    dispatch.dispatch(provider.id)
    assert running(provider) == {"big": 4}
    queue(small, 5, at=now)
    # One slot turns over: the small project takes it, though 296 older jobs wait.
    finish(big_ids[0])
    dispatch.dispatch(provider.id)
    assert running(provider) == {"big": 3, "small": 1}
    # Then the slots alternate while both have work: 2 of 4 each.
    finish(big_ids[1])
    dispatch.dispatch(provider.id)
    assert running(provider) == {"big": 2, "small": 2}


def test_within_a_project_the_oldest_goes_first(owner):
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    now = timezone.now()
    later = queue(project, 2, at=now)
    earlier = queue(project, 2, at=now - timedelta(minutes=1))
    claimed = [job_id for job_id, _ in dispatch.dispatch(provider.id)]
    assert claimed == earlier
    assert not set(claimed) & set(later)


def test_equal_projects_take_turns_longest_unserved_first(owner):
    provider = make_provider(owner, concurrency=1)
    projects = [make_project(owner, provider, name=f"p{n}") for n in range(3)]
    now = timezone.now()
    # p0's whole batch was started first: oldest first alone would run all of it first.
    for n, project in enumerate(projects):
        queue(project, 3, at=now - timedelta(minutes=10 - n))
    order = []
    for _ in range(6):
        [(job_id, _)] = dispatch.dispatch(provider.id)
        order.append(Job.objects.get(id=job_id).project.name)
        finish(job_id)
    assert order == ["p0", "p1", "p2", "p0", "p1", "p2"]
    assert ShareTurn.objects.filter(provider=provider).count() == 3


def test_a_weight_of_two_holds_twice_the_slots(owner):
    provider = make_provider(owner, concurrency=6)
    heavy = make_project(owner, provider, name="heavy", share_weight=2)
    light = make_project(owner, provider, name="light")
    now = timezone.now()
    queue(light, 10, at=now - timedelta(minutes=5))
    queue(heavy, 10, at=now)
    dispatch.dispatch(provider.id)
    assert running(provider) == {"heavy": 4, "light": 2}


def test_jobs_naming_the_provider_are_shared_per_project_too(owner):
    provider = make_provider(owner, concurrency=2)
    elsewhere = make_provider(owner, name="Elsewhere")
    # Both projects default to another provider; their drafts name this one.
    big, small = make_project(owner, elsewhere, name="big"), make_project(owner, elsewhere, name="small")
    now = timezone.now()
    queue(big, 50, at=now - timedelta(minutes=5), provider=provider)
    queue(small, 2, at=now, provider=provider)
    dispatch.dispatch(provider.id)
    assert running(provider) == {"big": 1, "small": 1}


def test_one_project_alone_writes_no_turns(owner):
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    queue(project, 3, at=timezone.now())
    assert len(dispatch.dispatch(provider.id)) == 2
    assert not ShareTurn.objects.exists()


def test_the_whole_queue_read_is_in_fair_order_too(owner):
    # Past the heads (fewer pending than the limit), every pending job is read: same order.
    provider = make_provider(owner, concurrency=10)
    big, small = make_project(owner, provider, name="big"), make_project(owner, provider, name="small")
    now = timezone.now()
    queue(big, 4, at=now - timedelta(minutes=5))
    queue(small, 2, at=now)
    jobs = hot_sql.dispatchable_with_projects(
        provider.id, projects=None, excluded_kinds=runner_registry.kinds(), limit=10, skip_locked=False
    )
    assert [job.project.name for job in jobs] == ["big", "small", "big", "small", "big", "big"]


def test_a_queued_job_behind_another_projects_slots_says_fair_share(owner, client):
    from queue_app.engine import heartbeats
    from queue_app.selectors import queue as queue_status
    from queue_app.selectors.job_list import job_row
    from queue_app.selectors.visibility import visible_providers

    provider = make_provider(owner, concurrency=4)
    big, small = make_project(owner, provider, name="big"), make_project(owner, provider, name="small")
    now = timezone.now()
    queue(big, 10, at=now - timedelta(minutes=1))
    dispatch.dispatch(provider.id)
    [waiting] = queue(small, 1, at=now)
    providers, live = visible_providers(owner), {"workers": 1, "queue_services": 1}
    row = job_row(Job.objects.select_related("project").get(id=waiting), providers=providers, live=live, now=timezone.now())
    assert row["state"] == "queued"
    assert row["waiting_reason"] == "fair share: project big is using 4 of 4 slots"
    # A job of the project holding every slot is simply queued: no other project holds any.
    own = Job.objects.select_related("project").filter(project=big, status=Status.PENDING).first()
    assert job_row(own, providers=providers, live=live, now=timezone.now())["waiting_reason"] == ""
    status = queue_status.queue_status(user=owner, breakdown="providers", live=heartbeats.liveness(now=timezone.now()) | live)
    [row] = [p for p in status["providers"] if p["id"] == provider.id]
    assert row["fair_share"] == "fair share: project big is using 4 of 4 slots"


@pytest.mark.parametrize("weight", [0, 10**9, -1, True, "2"])
def test_a_weight_out_of_bounds_is_refused_with_the_reason(owner, weight):
    from queue_app.services.errors import ServiceError
    from queue_app.services.projects import project_create

    with pytest.raises(ServiceError, match="fair-share weight must be a whole number from 1 to 1000"):
        project_create(user=owner, data={"name": "p", "share_weight": weight})


def test_the_weight_is_set_through_the_api_and_shown(owner, client):
    client.force_login(owner)
    created = client.post("/api/projects", {"name": "heavy", "share_weight": 3}, content_type="application/json")
    assert created.status_code in (200, 201), created.content
    assert created.json()["share_weight"] == 3
    refused = client.post("/api/projects", {"name": "x", "share_weight": 0}, content_type="application/json")
    assert refused.status_code == 400
