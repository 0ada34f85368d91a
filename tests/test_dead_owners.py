"""Issue 16 §2: a dead process's work is reclaimed in seconds whatever it held — claims
handed to a worker cluster that died before taking them (its local queue), and a
collector killed while downloading a finished remote task — across hosts by heartbeats,
with the lease as the backstop."""

import socket
import subprocess
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import heartbeats, transitions
from queue_app.models import Heartbeat, Job, Status
from queue_app.queue_service import recovery
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def cluster(*, host=None, pid=None, seen_ago=0.0):
    now = timezone.now()
    host = host or socket.gethostname()
    pid = pid or dead_pid()
    return Heartbeat.objects.create(
        name=f"worker:{host}:{pid}", role="worker", host=host, pid=pid, started_at=now, seen_at=now - timedelta(seconds=seen_ago)
    )


def handed_out(owner, inline_tasks):
    """A job claimed and handed to the broker; no worker has taken it (owner empty)."""
    provider = make_provider(owner)
    project = make_project(owner, provider)
    [job] = make_drafts(project, 1)
    jobs_start(user=owner, project=project, all_drafts=True)
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.lease_owner == "" and job.lease_expires_at > timezone.now()
    inline_tasks.queue.clear()  # the hand-off went into the dead cluster's local queue
    return job


def test_a_dead_clusters_untaken_claim_is_handed_out_again_at_once(owner, inline_tasks):
    job = handed_out(owner, inline_tasks)
    cluster()  # this host, its process gone
    assert recovery.heal() >= 1
    job_now = Job.objects.get(id=job.id)
    assert job_now.status == Status.PROCESSING and job_now.lease_token != job.lease_token
    assert inline_tasks.executions() == [(str(job.id), str(job_now.lease_token))]
    # released once per death: a tombstone the workers page lists, no longer a live cluster
    [beat] = Heartbeat.objects.all()
    assert beat.released_at is not None and heartbeats.alive("worker") == 0
    assert recovery.release_dead_clusters_handoffs() == 0 and heartbeats.dead_clusters() == []


def test_a_zombie_cluster_counts_as_dead_before_it_is_reaped(owner, inline_tasks):
    # A crashed qcluster worker stays a zombie until its sentinel's next guard cycle, and
    # a killed cluster's workers until init reaps them; the kernel still answers signal 0.
    zombie = subprocess.Popen(["true"])
    try:
        assert _waited_to_exit_unreaped(zombie.pid)
        job = handed_out(owner, inline_tasks)
        cluster(pid=zombie.pid)
        assert recovery.heal() >= 1
        assert Job.objects.get(id=job.id).lease_token != job.lease_token
    finally:
        zombie.wait()


def _waited_to_exit_unreaped(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            if stat.read().rpartition(b") ")[2][:1] == b"Z":
                return True
        time.sleep(0.01)
    return False


def test_a_cluster_on_another_host_that_stopped_beating_releases_its_claims(owner, inline_tasks, settings):
    job = handed_out(owner, inline_tasks)
    cluster(host="other-host", pid=4242, seen_ago=settings.HEARTBEAT_SECONDS * 3 + 1)
    recovery.heal()
    assert Job.objects.get(id=job.id).lease_token != job.lease_token


def test_a_live_cluster_keeps_the_claims_it_was_handed(owner, inline_tasks):
    job = handed_out(owner, inline_tasks)
    cluster(host="other-host", pid=4242)  # beating
    recovery.heal()
    assert Job.objects.get(id=job.id).lease_token == job.lease_token
    assert inline_tasks.executions() == []


def detached(owner, inline_tasks):
    job = handed_out(owner, inline_tasks)
    assert transitions.job_detach(job.id, job.lease_token, task_id="task-1", poll_seconds=30)
    return Job.objects.get(id=job.id)


def collecting(job, lease_owner):
    """A collector took the job's lease (attempt_begin) and is downloading."""
    Job.objects.filter(id=job.id).update(
        lease_owner=lease_owner, lease_expires_at=timezone.now() + timedelta(seconds=10), next_poll_at=None
    )


def test_a_killed_collectors_job_goes_back_to_the_poller_at_once(owner, inline_tasks):
    job = detached(owner, inline_tasks)
    collecting(job, f"{socket.gethostname()}:{dead_pid()}")
    assert recovery.heal() == 1
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.task_id == "task-1" and job.slot is not None
    assert job.lease_owner == "" and job.lease_expires_at is None and job.next_poll_at <= timezone.now()


def test_a_collector_on_a_silent_host_is_reclaimed(owner, inline_tasks, settings):
    job = detached(owner, inline_tasks)
    Heartbeat.objects.create(
        name="queue_service:far:7",
        role="queue_service",
        host="far",
        pid=7,
        started_at=timezone.now(),
        seen_at=timezone.now() - timedelta(seconds=settings.HEARTBEAT_SECONDS * 3 + 1),
    )
    collecting(job, "far:99")
    assert recovery.heal() == 1
    assert Job.objects.get(id=job.id).lease_owner == ""


def test_a_live_collector_keeps_its_job(owner, inline_tasks):
    job = detached(owner, inline_tasks)
    collecting(job, f"{socket.gethostname()}:{__import__('os').getpid()}")
    assert recovery.heal() == 0
    assert Job.objects.get(id=job.id).lease_owner != ""


def test_a_dead_clusters_untaken_collection_is_polled_again_at_once(owner, inline_tasks):
    job = detached(owner, inline_tasks)
    Job.objects.filter(id=job.id).update(poll_claimed_until=timezone.now() + timedelta(seconds=60), next_poll_at=None)
    cluster()
    recovery.heal()
    job.refresh_from_db()
    assert job.poll_claimed_until is None and job.next_poll_at <= timezone.now()


def running_jobs(owner, inline_tasks, n, lease_owner):
    provider = make_provider(owner, concurrency=n)
    project = make_project(owner, provider)
    jobs = make_drafts(project, n)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.queue.clear()
    Job.objects.filter(project=project).update(lease_owner=lease_owner, lease_expires_at=timezone.now() + timedelta(seconds=10))
    return jobs


def heal_queries(n, owner, inline_tasks):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    Job.objects.all().delete()
    running_jobs(owner, inline_tasks, n, "busy-host:77")
    with CaptureQueriesContext(connection) as queries:
        assert recovery.heal() == 0
    return len(queries)


def test_healing_asks_about_each_owner_once_not_each_job(owner, inline_tasks):
    Heartbeat.objects.create(
        name="worker:busy-host:1", role="worker", host="busy-host", pid=1, started_at=timezone.now(), seen_at=timezone.now()
    )
    assert heal_queries(40, owner, inline_tasks) == heal_queries(3, owner, inline_tasks)


def test_one_heal_reclaims_exactly_the_dead_owners_work(owner, inline_tasks):
    here = socket.gethostname()
    live = running_jobs(owner, inline_tasks, 2, f"{here}:{__import__('os').getpid()}")
    dead = running_jobs(owner, inline_tasks, 3, f"{here}:{dead_pid()}")
    collector = detached(owner, inline_tasks)
    collecting(collector, f"{here}:{dead_pid()}")
    assert recovery.heal() == 4
    assert all(Job.objects.get(id=j.id).lease_owner != "" for j in live)
    assert all(Job.objects.get(id=j.id).lease_owner == "" for j in dead)
    assert Job.objects.get(id=collector.id).lease_owner == ""


def test_a_running_job_on_a_silent_host_keeps_its_lease_until_it_expires(owner, inline_tasks, settings):
    # A silent host may be cut off by the network with its worker still inside the
    # provider call: rerunning the job before the lease runs out pays twice and puts one
    # call more in flight than the provider's concurrency (chaos-hosts scenario 3).
    [draft] = running_jobs(owner, inline_tasks, 1, "far:99")
    job = Job.objects.get(id=draft.id)
    for role, pid in (("worker", 99), ("queue_service", 7)):  # the whole host went quiet
        Heartbeat.objects.create(
            name=f"{role}:far:{pid}",
            role=role,
            host="far",
            pid=pid,
            started_at=timezone.now(),
            seen_at=timezone.now() - timedelta(seconds=settings.HEARTBEAT_SECONDS * 3 + 1),
        )
    recovery.heal()
    still = Job.objects.get(id=job.id)
    assert still.status == Status.PROCESSING and still.lease_token == job.lease_token and still.lease_owner == "far:99"
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    recovery.heal()
    assert Job.objects.get(id=job.id).lease_token != job.lease_token


def test_a_killed_workers_jobs_are_healed_within_the_dead_owner_cadence_not_the_heal_interval(owner, inline_tasks, settings):
    from queue_app.queue_service.loop import QueueService

    settings.HEAL_INTERVAL_SECONDS = 60  # the full heal will not come round in this test
    settings.DEAD_OWNER_SECONDS = 0.2
    service = QueueService()
    service.tick()  # every step ran once; the next heal is a minute away
    here = socket.gethostname()
    dead = running_jobs(owner, inline_tasks, 2, f"{here}:{dead_pid()}")
    claimed = handed_out(owner, inline_tasks)
    cluster()  # a cluster of this host died with the claim in its local queue
    deadline = time.monotonic() + 0.2 + 1.0
    while time.monotonic() < deadline and any(Job.objects.get(id=j.id).lease_owner != "" for j in dead):
        service.tick()
        time.sleep(0.05)
    assert all(Job.objects.get(id=j.id).lease_owner == "" for j in dead)
    assert Job.objects.get(id=claimed.id).lease_token != claimed.lease_token  # handed out again


def test_a_fork_waits_for_the_heartbeat_in_progress():
    # qcluster forks its processes from the one whose heartbeat thread writes: a child
    # forked mid-beat inherited SQLite's record of a lock it did not hold.
    import os
    import threading

    heartbeats._beating.acquire()  # a beat in progress
    ended = []

    def beat_ends():
        ended.append(time.monotonic())
        heartbeats._beating.release()

    threading.Timer(0.3, beat_ends).start()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    forked_at = time.monotonic()
    os.waitpid(pid, 0)
    assert ended and forked_at >= ended[0]
