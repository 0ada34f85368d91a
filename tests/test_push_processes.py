"""Finish notifications with real processes: workers, two queue services, a queue service
that dies between recording a finish and sending it."""

import time

import pytest

from queue_app.models import Job, ProjectRun, Status
from queue_app.notifications import devices
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider
from tests.fakes.push_service import Device, PushService

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SETTLE = 1


@pytest.fixture
def push_service(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]  # handed to the child processes by procs
    with PushService() as service:
        yield service


def subscribe(user, service, name="phone") -> Device:
    device = Device(service.endpoint(name))
    info = device.subscription_info()
    devices.subscription_save(user=user, endpoint=info["endpoint"], **info["keys"])
    return device


def all_finished(project) -> bool:
    return not Job.objects.filter(project=project, status__in=[Status.PENDING, Status.PROCESSING]).exists()


def test_two_queue_services_observing_the_same_finish_send_once(owner, tmp_path, push_service):
    provider = make_provider(owner, concurrency=2, latency_ms=100)
    project = make_project(owner, provider, name="Foxes")
    phone = subscribe(owner, push_service)
    make_drafts(project, 6)
    logs = tmp_path / "logs"
    running = [
        procs.qcluster(logs, workers=2),
        procs.queue_service(logs, PUSH_SETTLE_SECONDS=SETTLE),
        procs.queue_service(logs, PUSH_SETTLE_SECONDS=SETTLE),
    ]
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(lambda: phone.messages(push_service), timeout=120, message="a finish notification")
        time.sleep(SETTLE + 3)  # time for a duplicate to show up, if there were one
    finally:
        for proc in running:
            proc.stop()
    assert [(m["title"], m["body"]) for m in phone.messages(push_service)] == [("Foxes is done", "All 6 jobs finished.")]
    assert len(push_service.received()) == 1


def test_a_queue_service_dying_after_the_last_completion_leaves_the_finish_to_the_next(owner, tmp_path, push_service):
    provider = make_provider(owner, concurrency=2, latency_ms=50)
    project = make_project(owner, provider, name="Owls")
    phone = subscribe(owner, push_service)
    make_drafts(project, 3)
    logs = tmp_path / "logs"
    cluster = procs.qcluster(logs, workers=2)
    # This one exits hard right after it recorded the finish, before any send.
    doomed = procs.queue_service(logs, PUSH_SETTLE_SECONDS=SETTLE, FAILPOINTS="push_after_close")
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(lambda: not doomed.alive(), timeout=120, message="the queue service to die at the failpoint")
        assert doomed.popen.returncode == 137
        assert ProjectRun.objects.get(project=project).closed_at is not None
        assert push_service.received() == []
        restarted = procs.queue_service(logs, PUSH_SETTLE_SECONDS=SETTLE)
        try:
            procs.wait_for(lambda: phone.messages(push_service), timeout=60, message="the notification after the restart")
            time.sleep(3)
        finally:
            restarted.stop()
    finally:
        doomed.stop()
        cluster.stop()
    assert [m["body"] for m in phone.messages(push_service)] == ["All 3 jobs finished."]


def test_a_queue_service_killed_before_the_finish_settled_is_replaced_and_sends_once(owner, tmp_path, push_service):
    provider = make_provider(owner, concurrency=2, latency_ms=50)
    project = make_project(owner, provider, name="Bats")
    phone = subscribe(owner, push_service)
    make_drafts(project, 2)
    logs = tmp_path / "logs"
    cluster = procs.qcluster(logs, workers=2)
    # A long settle delay: this service sees the completions but is killed before it closes the run.
    first = procs.queue_service(logs, PUSH_SETTLE_SECONDS=600)
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        procs.wait_for(lambda: all_finished(project), timeout=120, message="the jobs to finish")
        time.sleep(1.5)
        first.kill()
        assert ProjectRun.objects.get(project=project).closed_at is None and push_service.received() == []
        second = procs.queue_service(logs, PUSH_SETTLE_SECONDS=SETTLE)
        try:
            procs.wait_for(lambda: phone.messages(push_service), timeout=60, message="the notification after the restart")
            time.sleep(3)
        finally:
            second.stop()
    finally:
        first.stop()
        cluster.stop()
    assert [m["body"] for m in phone.messages(push_service)] == ["All 2 jobs finished."]
