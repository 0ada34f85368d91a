"""The recovery scan and healing: only work whose owner is gone is touched."""

import os
import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.models import Job, JobAttempt, Provider, Status
from queue_app.queue_service import recovery
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider, status_of

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(owner, n=1, concurrency=1, **options):
    provider = make_provider(owner, concurrency=concurrency, **options)
    project = make_project(owner, provider)
    jobs = make_drafts(project, n)
    jobs_start(user=owner, project=project, all_drafts=True)
    return provider, project, jobs


def test_an_expired_lease_is_healed_with_the_interrupted_attempt_recorded(owner, inline_tasks):
    provider, _, [job] = claimed(owner)
    Provider.objects.filter(id=provider.id).update(paused=True)  # keep it pending after healing
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1), lease_owner="gone:1")
    JobAttempt.objects.create(job=job, number=1, worker="gone:1")
    assert recovery.heal() == 1
    job.refresh_from_db()
    assert job.status == Status.PENDING and job.slot is None and "worker stopped" in job.error
    assert JobAttempt.objects.get(job=job).outcome == "interrupted"


def test_a_live_lease_is_never_touched(owner, inline_tasks):
    _, _, [job] = claimed(owner)
    Job.objects.filter(id=job.id).update(lease_owner="other-host:4242")
    assert recovery.heal() == 0
    assert recovery.recover()["healed"] == 0
    assert status_of(job) == Status.PROCESSING


def test_a_lease_of_a_dead_process_on_this_host_is_healed_without_waiting(owner, inline_tasks):
    provider, _, [job] = claimed(owner)
    Provider.objects.filter(id=provider.id).update(paused=True)
    dead_pid = max(os.getpid() + 100000, 4000000)
    Job.objects.filter(id=job.id).update(lease_owner=f"{socket.gethostname()}:{dead_pid}")
    assert recovery.heal() == 1
    assert status_of(job) == Status.PENDING


def test_a_job_that_keeps_losing_its_worker_fails_after_max_attempts(owner, inline_tasks):
    provider, _, [job] = claimed(owner)
    Job.objects.filter(id=job.id).update(attempts=provider.max_attempts, lease_expires_at=timezone.now() - timedelta(seconds=1))
    recovery.heal()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error.startswith(f"gave up after {provider.max_attempts} attempts")


def test_detached_jobs_keep_their_slots_and_are_polled_at_once_with_a_fresh_timeout_window(owner, inline_tasks):
    _, _, [job] = claimed(owner, mode="async", latency_ms=60000)
    inline_tasks.run()
    job.refresh_from_db()
    assert job.task_id and job.slot == 0
    old = timezone.now() - timedelta(hours=1)
    Job.objects.filter(id=job.id).update(next_poll_at=timezone.now() + timedelta(minutes=5), task_observed_at=old)
    counts = recovery.recover()
    job.refresh_from_db()
    assert counts["detached_resumed"] == 1
    assert job.status == Status.PROCESSING and job.slot == 0
    assert job.next_poll_at <= timezone.now() and job.task_observed_at > old


def test_recovery_dispatches_pending_work(owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 3)
    Job.objects.filter(id__in=[j.id for j in jobs]).update(status=Status.PENDING, queued_at=timezone.now())
    assert recovery.recover()["dispatched"] == 2
    assert Job.objects.filter(status=Status.PROCESSING).count() == 2


def test_the_scan_walks_in_batches(owner, inline_tasks, monkeypatch):
    monkeypatch.setattr(recovery, "BATCH", 7)
    provider, project, _ = claimed(owner, n=0)
    Provider.objects.filter(id=provider.id).update(paused=True, concurrency=30)
    jobs = make_drafts(project, 30)
    for slot, job in enumerate(jobs):
        Job.objects.filter(id=job.id).update(
            status=Status.PROCESSING, active_provider=provider, slot=slot, lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
    assert recovery.heal() == 30
    assert Job.objects.filter(status=Status.PENDING).count() == 30


@pytest.mark.postgres
def test_a_lease_keeper_whose_connection_was_killed_reconnects_and_keeps_renewing(owner, inline_tasks, settings):
    """A killed backend (database restart, pg_terminate_backend) must not leave the lease
    to lapse while the worker is still busy with the provider: that would hand the job to
    a second worker and pay for it twice."""
    import time

    from django.db import connection

    from queue_app.engine.leases import LeaseKeeper

    settings.LEASE_RENEW_SECONDS = 0.1
    _, _, [job] = claimed(owner)
    token = Job.objects.get(id=job.id).lease_token
    with LeaseKeeper(job.id, token) as keeper:
        # The renewer may be in a longer wait it began before the setting changed: wait for
        # its first renewal (it holds its connection from then on), not for a fixed time.
        entered = keeper._confirmed
        deadline = time.monotonic() + 10
        while keeper._confirmed == entered and time.monotonic() < deadline:
            time.sleep(0.02)
        assert keeper._confirmed > entered, "the lease was never renewed"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] >= 1  # the keeper's own connection
            cursor.execute("SELECT now()")
            killed_at = cursor.fetchone()[0]
        time.sleep(0.8)
        expires = Job.objects.values_list("lease_expires_at", flat=True).get(id=job.id)
    assert not keeper.lost.is_set()
    assert expires > killed_at + timedelta(seconds=settings.LEASE_TTL_SECONDS)


@pytest.mark.postgres
def test_a_connection_killed_after_the_provider_answered_still_records_the_answer(owner, inline_tasks, monkeypatch):
    """The provider generated (and billed) the image; then the worker's backend is killed.
    Leaving the job to healing would send it again: the worker reconnects once and writes."""
    from django.db import OperationalError, connection

    from queue_app import providers
    from queue_app.models import AlbumItem

    _, _, [job] = claimed(owner)
    Provider.objects.filter(id=job.project.provider_id).update(options={"latency_ms": 0})
    real_call, calls = providers.call, []

    def call_then_lose_the_database(request, fn, *args):
        result = real_call(request, fn, *args)
        calls.append(fn.__name__)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        except OperationalError:
            pass  # our own backend is gone now: the next query on this connection fails
        return result

    monkeypatch.setattr(providers, "call", call_then_lose_the_database)
    inline_tasks.run()
    job.refresh_from_db()
    assert calls == ["submit"]
    assert job.status == Status.COMPLETED and AlbumItem.objects.filter(job=job).count() == 1
    assert list(JobAttempt.objects.filter(job=job).values_list("outcome", flat=True)) == ["completed"]


def test_a_database_error_during_the_start_scan_does_not_take_the_queue_service_down(owner, inline_tasks, monkeypatch):
    from django.db import OperationalError

    from queue_app.queue_service.loop import QueueService

    provider, _, [job] = claimed(owner)
    Provider.objects.filter(id=provider.id).update(paused=True)  # keep it pending after healing
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1), lease_owner="gone:1")
    real, failures = recovery.recover, []

    def recover_after_a_dropped_connection():
        if not failures:
            failures.append(1)
            raise OperationalError("terminating connection due to administrator command")
        return real()

    monkeypatch.setattr(recovery, "recover", recover_after_a_dropped_connection)
    QueueService().run(max_ticks=1)  # used to raise out of the scan and end the service
    assert failures == [1]
    assert status_of(job) == Status.PENDING  # the scan ran again and healed the job
