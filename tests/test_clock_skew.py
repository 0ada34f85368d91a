"""A host whose clock runs ahead takes nothing early: leases, claims and heartbeats are
compared on the database's clock (engine/clock.py), not the process's.

The process clock is moved 60 s ahead by patching `timezone.now`; PostgreSQL keeps the
true time (with SQLite the database's clock is the process's, so these need PostgreSQL).
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app import services
from queue_app.engine import heartbeats
from queue_app.engine.clock import db_now
from queue_app.models import Heartbeat, Job, Status
from queue_app.service import poller, recovery
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

AHEAD = timedelta(seconds=60)


@pytest.fixture
def clock_ahead(monkeypatch):
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + AHEAD)


def _other_host_worker_beating():
    now = db_now()
    return Heartbeat.objects.create(
        name="worker:other-host:4242", role="worker", host="other-host", pid=4242, started_at=now, seen_at=now
    )


def test_a_host_ahead_by_60_s_heals_no_live_claim_and_keeps_other_hosts_alive(owner, inline_tasks, clock_ahead):
    provider = make_provider(owner)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    services.jobs_start(user=owner, project=project, all_drafts=True)  # claimed, not taken yet
    token = Job.objects.values_list("lease_token", flat=True).get(id=job.id)
    beat = _other_host_worker_beating()

    assert heartbeats.host_is_silent("other-host") is False
    assert heartbeats.dead_clusters() == []
    assert recovery.heal() == 0
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.lease_token == token
    assert Heartbeat.objects.filter(id=beat.id).exists()


def test_a_poller_ahead_by_60_s_takes_no_live_collection_hold(owner, inline_tasks, clock_ahead):
    provider = make_provider(owner, mode="async", latency_ms=0)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    services.jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    now = db_now()
    # Another queue service handed the finished task to a collector 1 s ago.
    held_until = now + timedelta(seconds=poller.COLLECT_CLAIM_SECONDS - 1)
    assert Job.objects.filter(id=job.id).exclude(task_id="").update(next_poll_at=now, poll_claimed_until=held_until)
    assert poller.claim_due() == []


def test_a_backoff_is_measured_on_the_database_clock(owner, inline_tasks, clock_ahead):
    from queue_app.engine import transitions

    provider = make_provider(owner, concurrency=1)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    services.jobs_start(user=owner, project=project, all_drafts=True)
    token = Job.objects.values_list("lease_token", flat=True).get(id=job.id)
    assert transitions.job_requeue(job.id, token, reason="busy", error_class="transient", delay=5)
    not_before = Job.objects.values_list("not_before", flat=True).get(id=job.id)
    assert timedelta(seconds=4) < not_before - db_now() <= timedelta(seconds=5)
