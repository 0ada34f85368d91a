"""A host whose clock runs ahead takes nothing early: leases, claims and heartbeats are
compared on the database's clock (engine/clock.py), not the process's.

The process clock is moved 60 s ahead by patching `timezone.now`; PostgreSQL keeps the
true time (with SQLite the database's clock is the process's, so these need PostgreSQL).
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.engine.clock import db_now
from queue_app.models import Heartbeat, Job, Status
from queue_app.queue_service import poller, recovery
from queue_app.services.jobs import jobs_start
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
    jobs_start(user=owner, project=project, all_drafts=True)  # claimed, not taken yet
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
    jobs_start(user=owner, project=project, all_drafts=True)
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
    jobs_start(user=owner, project=project, all_drafts=True)
    token = Job.objects.values_list("lease_token", flat=True).get(id=job.id)
    assert transitions.job_requeue(job.id, token, reason="busy", error_class="transient", delay=5)
    not_before = Job.objects.values_list("not_before", flat=True).get(id=job.id)
    assert timedelta(seconds=4) < not_before - db_now() <= timedelta(seconds=5)


def test_a_queue_service_ahead_by_60_s_dispatches_when_a_cool_down_ends(owner, inline_tasks, clock_ahead):
    import time

    from queue_app.models import Provider
    from queue_app.queue_service.loop import QueueService

    provider = make_provider(owner)
    Provider.objects.filter(id=provider.id).update(paused=True)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    until = db_now() + timedelta(milliseconds=400)
    Provider.objects.filter(id=provider.id).update(paused=False, cooldown_until=until)
    service = QueueService()
    service.step_wake()
    # Read on the process's clock, the moment was already 59.6 s past: never woken for.
    assert service.wake_at == until
    assert 0 < service.idle_sleep() <= 0.41
    assert service.step_wake() is False  # not yet: the database says it is still cooling down
    time.sleep(max(0.0, (until - db_now()).total_seconds()) + 0.02)
    assert service.step_wake() is True
    job.refresh_from_db()
    assert job.status == Status.PROCESSING


def test_a_push_sender_ahead_by_60_s_takes_no_live_senders_rows(owner, clock_ahead):
    from queue_app.models import ProjectRun, PushOutbox, PushSubscription
    from queue_app.notifications import outbox

    project = make_project(owner, name="Herons")
    now = db_now()
    run = ProjectRun.objects.create(project=project, opened_at=now, last_started_at=now, closed_at=now, total=1, completed=1)
    subscription = PushSubscription.objects.create(user=owner, endpoint="https://push.invalid/x", p256dh="k", auth="a")
    # Another host's sender claimed the row a few seconds ago and is inside its send.
    held = now + timedelta(seconds=outbox.SEND_CLAIM_SECONDS - 5)
    row = PushOutbox.objects.create(
        run=run, subscription=subscription, payload={"title": "t"}, next_try_at=now, claimed_until=held, attempts=1
    )
    sender = outbox.Sender()
    try:
        assert sender.step() == 0
    finally:
        sender.close()
    row.refresh_from_db()
    assert row.claimed_until == held and row.attempts == 1


def test_a_process_ahead_by_60_s_takes_over_no_live_upload_claim(owner, clock_ahead):
    from comfy_app.models import ComfyInstance, ComfyUpload
    from comfy_app.runner import uploads

    project = make_project(owner, kind="comfyui", name="Comfy")
    instance = ComfyInstance.objects.create(project=project, base_url="http://127.0.0.1:9")
    # Another host's process is uploading: its claim has 30 s to run on the database's clock.
    held = db_now() + timedelta(seconds=30)
    ComfyUpload.objects.create(instance_id=instance.id, address="http://127.0.0.1:9", name="ref.png", claimed_until=held)
    _, mine = uploads._claim(instance.id, "http://127.0.0.1:9", "ref.png")
    assert mine is False
    # Its own claim lasts CLAIM_SECONDS on the database's clock, not 60 s longer.
    ComfyUpload.objects.all().delete()
    row, mine = uploads._claim(instance.id, "http://127.0.0.1:9", "ref.png")
    row.refresh_from_db()
    assert mine and row.claimed_until - db_now() <= timedelta(seconds=uploads.CLAIM_SECONDS)
