"""Retry now: a job waiting out a retry backoff, or all such jobs of a provider, are
dispatchable at once (still within the provider's limit and cool-down)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import enqueue
from queue_app.models import Job, Provider, Status
from queue_app.services.priority import jobs_retry_now, provider_retry_now
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr(enqueue, "enqueue_task", lambda *args, **kwargs: None)


def in_backoff(project, n, provider):
    jobs = make_drafts(project, n)
    later = timezone.now() + timedelta(hours=1)
    Job.objects.filter(id__in=[job.id for job in jobs]).update(status=Status.PENDING, queued_at=timezone.now(), not_before=later)
    return [str(job.id) for job in jobs]


def test_a_job_in_backoff_retried_now_is_claimed_at_once(owner):
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    ids = in_backoff(project, 2, provider)
    assert jobs_retry_now(user=owner, job_ids=[ids[0]]) == {"retried_now": [ids[0]], "skipped": 0}
    # Its wake dispatched it: the other keeps its backoff.
    assert Job.objects.get(id=ids[0]).status == Status.PROCESSING
    assert Job.objects.get(id=ids[1]).status == Status.PENDING and Job.objects.get(id=ids[1]).not_before is not None


def test_all_of_a_providers_jobs_in_backoff_and_only_the_owners(owner, outsider, client):
    provider = make_provider(owner, concurrency=5)
    Provider.objects.filter(id=provider.id).update(paused=True)  # so they stay pending to be counted
    project = make_project(owner, provider)
    ids = in_backoff(project, 3, provider)
    other = in_backoff(make_project(owner, make_provider(owner, name="Other")), 1, provider)
    assert provider_retry_now(user=owner, provider_id=provider.id) == {"retried_now": 3}
    assert not Job.objects.filter(id__in=ids, not_before__isnull=False).exists()
    assert Job.objects.get(id=other[0]).not_before is not None
    client.force_login(outsider)
    assert client.post(f"/api/providers/{provider.id}/retry-now", {}, content_type="application/json").status_code == 404


def test_retry_now_from_the_api_and_the_monitor(owner, client):
    provider = make_provider(owner, concurrency=5)
    Provider.objects.filter(id=provider.id).update(paused=True)
    project = make_project(owner, provider)
    ids = in_backoff(project, 3, provider)
    client.force_login(owner)
    answer = client.post("/api/jobs/retry-now", {"job_ids": [ids[0]]}, content_type="application/json")
    assert answer.status_code == 200 and answer.json() == {"retried_now": [ids[0]], "skipped": 0}
    assert client.post(f"/api/providers/{provider.id}/retry-now", {}, content_type="application/json").json() == {
        "retried_now": 2
    }
    ids = in_backoff(project, 1, provider)
    client.post(f"/queue/providers/{provider.id}/retry-now")
    assert Job.objects.get(id=ids[0]).not_before is None
