"""Run next: pending jobs moved to the front of their provider's queue are its next claims,
within its limit, cool-down and their own backoff."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import dispatch, enqueue
from queue_app.models import Job, Provider, Status
from queue_app.services.priority import jobs_run_next
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr(enqueue, "enqueue_task", lambda *args, **kwargs: None)


def queue(project, n, *, at, **fields):
    jobs = make_drafts(project, n, **fields)
    Job.objects.filter(id__in=[job.id for job in jobs]).update(status=Status.PENDING, queued_at=at)
    return [str(job.id) for job in jobs]


def finish(job_id):
    Job.objects.filter(id=job_id).update(
        status=Status.COMPLETED, active_provider=None, slot=None, lease_token=None, lease_owner="", lease_expires_at=None
    )


def claim_one(provider) -> str:
    [(job_id, _)] = dispatch.dispatch(provider.id)
    return str(job_id)


def test_a_job_moved_to_the_front_is_the_next_claim_past_fair_share_and_age(owner):
    provider = make_provider(owner, concurrency=1)
    big, small = make_project(owner, provider, name="big"), make_project(owner, provider, name="small")
    now = timezone.now()
    big_ids = queue(big, 300, at=now - timedelta(minutes=5))
    small_ids = queue(small, 3, at=now)
    first = claim_one(provider)
    assert first == big_ids[0]
    # Fair share would give the slot to "small" next; the last job of "big" was moved.
    assert jobs_run_next(user=owner, job_ids=[big_ids[-1], big_ids[-2]]) == {"moved": [big_ids[-1], big_ids[-2]], "skipped": 0}
    finish(first)
    assert claim_one(provider) == big_ids[-1]
    finish(big_ids[-1])
    assert claim_one(provider) == big_ids[-2]
    finish(big_ids[-2])
    assert claim_one(provider) == small_ids[0]
    assert Job.objects.get(id=big_ids[-1]).run_next_at is None  # cleared at its claim


def test_run_next_keeps_the_limit_the_cool_down_and_the_jobs_backoff(owner):
    provider = make_provider(owner, concurrency=1)
    project = make_project(owner, provider)
    now = timezone.now()
    ids = queue(project, 3, at=now)
    running = claim_one(provider)
    jobs_run_next(user=owner, job_ids=[ids[2]])
    assert dispatch.dispatch(provider.id) == []  # the one slot is held
    finish(running)
    Provider.objects.filter(id=provider.id).update(cooldown_until=now + timedelta(hours=1))
    assert dispatch.dispatch(provider.id) == []
    Provider.objects.filter(id=provider.id).update(cooldown_until=None)
    Job.objects.filter(id=ids[2]).update(not_before=now + timedelta(hours=1))
    assert claim_one(provider) == ids[1]  # in backoff: not due yet, the next goes


def test_only_the_users_pending_jobs_move(owner, outsider):
    provider = make_provider(owner, concurrency=1)
    project = make_project(owner, provider)
    [pending] = queue(project, 1, at=timezone.now())
    [draft] = make_drafts(project, 1)
    result = jobs_run_next(user=owner, job_ids=[pending, str(draft.id)])
    assert result == {"moved": [pending], "skipped": 1}
    assert jobs_run_next(user=outsider, job_ids=[pending]) == {"moved": [], "skipped": 1}


def test_run_next_from_the_api_mcp_and_pages(owner, outsider, client):
    import json

    from django.test import Client as DjangoClient

    from queue_app.web import tokens

    provider = make_provider(owner, concurrency=1)
    Provider.objects.filter(id=provider.id).update(paused=True)  # nothing is claimed meanwhile
    project = make_project(owner, provider)
    ids = queue(project, 5, at=timezone.now())
    raw = tokens.token_create(user=owner, name="t")[1]
    api = DjangoClient(HTTP_AUTHORIZATION=f"Bearer {raw}")
    answer = api.post("/api/jobs/run-next", {"job_ids": [ids[4], ids[3]]}, content_type="application/json")
    assert answer.status_code == 200 and answer.json() == {"moved": [ids[4], ids[3]], "skipped": 0}
    assert api.post("/api/jobs/run-next", {"job_ids": ["nope"]}, content_type="application/json").status_code == 400
    arguments = {"job_ids": [ids[2]]}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_next_jobs", "arguments": arguments}}
    reply = api.post("/mcp", data=json.dumps(call), content_type="application/json").json()
    assert reply["result"]["structuredContent"] == {"moved": [ids[2]], "skipped": 0}
    client.force_login(owner)
    client.post(f"/projects/{project.id}/run-next", {"only": ids[1]})
    client.post(f"/jobs/{ids[0]}/run-next")
    client.post("/queue/run-next", {"job": [ids[4]]})
    moved = Job.objects.filter(id__in=ids).order_by("run_next_at").values_list("id", flat=True)
    assert [str(i) for i in moved] == [ids[3], ids[2], ids[1], ids[0], ids[4]]
    # Another user's job: not found.
    client.force_login(outsider)
    assert client.post(f"/jobs/{ids[0]}/run-next").status_code == 404
