"""An attempt row never stays "running" on a job nobody executes any more.

Seen once in a chaos run: a worker killed after the remote task id was stored and before
its attempt was closed left the attempt "running" — the job was detached (no lease), so
no heal looked at it again, and the poller went on to complete it. A kill is simulated
here by an exception no handler catches, raised at the exact instruction.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import failpoints, transitions
from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.queue_service import recovery
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider
from tests.engine_helpers import poll_once

pytestmark = pytest.mark.django_db(transaction=True)


class Killed(BaseException):
    """The worker process died here."""


def _started_async(owner):
    provider = make_provider(owner, mode="async", latency_ms=0)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    return job


def _run_to_the_end(job, inline_tasks):
    """What the rest of the system does after the kill: heal (leases lapsed), poll, collect."""
    Job.objects.filter(id=job.id, lease_expires_at__isnull=False).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    recovery.heal()
    for _ in range(5):
        inline_tasks.run()
        poll_once(now=timezone.now() + timedelta(seconds=60))
        inline_tasks.run()
        if Job.objects.filter(id=job.id, status=Status.COMPLETED).exists():
            break
    job.refresh_from_db()
    return job


def test_a_worker_killed_right_after_storing_the_task_id_leaves_no_attempt_running(owner, inline_tasks, monkeypatch):
    job = _started_async(owner)
    real_detach = transitions.job_detach

    def detach_then_die(*args, **kwargs):
        real_detach(*args, **kwargs)
        raise Killed

    monkeypatch.setattr(transitions, "job_detach", detach_then_die)
    with pytest.raises(Killed):
        inline_tasks.run(limit=1)
    monkeypatch.setattr(transitions, "job_detach", real_detach)

    job.refresh_from_db()
    assert job.task_id and job.lease_expires_at is None  # detached: the poller's now
    assert not JobAttempt.objects.filter(job=job, outcome=JobAttempt.Outcome.RUNNING).exists()
    job = _run_to_the_end(job, inline_tasks)
    assert job.status == Status.COMPLETED and AlbumItem.objects.filter(job=job).count() == 1
    assert not JobAttempt.objects.filter(job=job, outcome=JobAttempt.Outcome.RUNNING).exists()


def test_a_worker_killed_inside_the_detach_stores_neither_and_healing_closes_its_attempt(owner, inline_tasks, monkeypatch):
    job = _started_async(owner)
    real_hit = failpoints.hit

    def hit(name):
        if name == "after_task_id_before_attempt_closed":
            raise Killed
        real_hit(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    with pytest.raises(Killed):
        inline_tasks.run(limit=1)
    monkeypatch.setattr(failpoints, "hit", real_hit)

    job.refresh_from_db()
    assert job.task_id == "" and job.status == Status.PROCESSING  # rolled back with the process
    job = _run_to_the_end(job, inline_tasks)
    assert job.status == Status.COMPLETED and AlbumItem.objects.filter(job=job).count() == 1
    outcomes = sorted(JobAttempt.objects.filter(job=job).values_list("outcome", flat=True))
    assert "running" not in outcomes and "interrupted" in outcomes
