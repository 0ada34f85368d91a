"""A full media disk: writing the results fails cleanly — no album item, no file half
written — the job waits with a readable reason and completes once there is space, without
paying the provider again for a result it already has (a remote task is collected)."""

import errno
import os
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from queue_app.engine import backoff, dispatch, outputs
from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.providers import demo
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider
from tests.engine_helpers import poll_once

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _whole_backoff(monkeypatch):
    """Each wait is its backoff's ceiling (2 s after a first try): full jitter can draw
    ~0 s, and then the refilled slot takes the job again before the test has looked."""
    monkeypatch.setattr(backoff, "delay", lambda attempt, **kw: backoff.ceiling(attempt))


@pytest.fixture
def disk_full(monkeypatch):
    """The media disk fills up: the data reaches the file, the flush to disk fails (where
    ENOSPC often shows on a real filesystem). `free()` gives the space back."""
    real_fsync = os.fsync

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", fsync)

    class Disk:
        def free(self):
            monkeypatch.setattr(outputs.os, "fsync", real_fsync)

    return Disk()


def _media_files() -> list:
    root = settings.MEDIA_ROOT
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _when_space_returns(job, inline_tasks):
    """The backoff passes and dispatch takes the job again."""
    Job.objects.filter(id=job.id).update(not_before=timezone.now() - timedelta(seconds=1))
    dispatch.ping_safety_net()
    inline_tasks.run()
    job.refresh_from_db()
    return job


def test_a_full_disk_leaves_no_item_and_no_file_and_the_job_waits_with_the_reason(owner, inline_tasks, disk_full):
    provider = make_provider(owner)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.PENDING and "media disk is full" in job.error
    assert job.slot is None and job.not_before is not None
    assert AlbumItem.objects.filter(job=job).count() == 0
    assert _media_files() == []  # the half-written temporary file went too
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.outcome == "local" and "media disk is full" in attempt.reason

    disk_full.free()
    job = _when_space_returns(job, inline_tasks)
    assert job.status == Status.COMPLETED and job.error == ""
    assert AlbumItem.objects.filter(job=job).count() == 1 and len(_media_files()) == 1


def test_a_collected_task_is_collected_again_not_resubmitted_after_the_disk_frees(owner, inline_tasks, disk_full):
    provider = make_provider(owner, mode="async")
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()  # submitted, detached
    assert poll_once(now=timezone.now() + timedelta(seconds=60)) == 1
    inline_tasks.run()  # the collection hits the full disk
    job.refresh_from_db()
    assert job.status == Status.PENDING and job.task_id and "media disk is full" in job.error
    assert _media_files() == []

    disk_full.free()
    job = _when_space_returns(job, inline_tasks)
    assert job.status == Status.COMPLETED
    assert AlbumItem.objects.filter(job=job).count() == 1
    assert len(demo.calls(provider.id)) == 1  # the finished task was adopted, not paid again


def test_a_disk_that_stays_full_fails_the_job_with_the_reason_after_its_attempts(owner, inline_tasks, disk_full):
    provider = make_provider(owner)
    provider.max_attempts = 2
    provider.save()
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job = _when_space_returns(job, inline_tasks)
    assert job.status == Status.FAILED and "media disk is full" in job.error and "gave up after 2" in job.error
    assert AlbumItem.objects.filter(job=job).count() == 0 and _media_files() == []


def test_nothing_is_sent_to_the_provider_while_the_media_disk_is_full(owner, inline_tasks, monkeypatch):
    provider = make_provider(owner)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    real_usage = outputs.shutil.disk_usage
    monkeypatch.setattr(outputs.shutil, "disk_usage", lambda path: real_usage(path)._replace(free=0))
    settings.MEDIA_ROOT.mkdir(parents=True, exist_ok=True)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job.refresh_from_db()
    assert demo.calls(provider.id) == []  # a result that could not be stored is not paid for
    assert job.status == Status.PENDING and "media disk is full" in job.error
    assert job.attempts == 0  # waiting for space costs none of its tries

    monkeypatch.setattr(outputs.shutil, "disk_usage", real_usage)
    job = _when_space_returns(job, inline_tasks)
    assert job.status == Status.COMPLETED and len(demo.calls(provider.id)) == 1
