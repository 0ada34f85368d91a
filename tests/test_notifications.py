"""Finish notifications: a project run that finishes sends one Web Push per device, with
the counts in its text, exactly once, through a fake push service on loopback."""

import logging
import threading
from datetime import timedelta

import pytest
from django.utils import timezone
from py_vapid import Vapid02

from queue_app.engine import project_runs
from queue_app.models import Job, ProjectEvent, ProjectRun, PushOutbox, PushSubscription, Status, VapidKeys
from queue_app.notifications import devices, outbox, vapid
from queue_app.providers import crypto
from queue_app.queue_service.loop import QueueService
from queue_app.services.jobs import failed_jobs_clear, jobs_retry, jobs_start
from tests.conftest import make_drafts, make_project, make_provider
from tests.fakes.push_service import Device, PushService

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def push_service(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    settings.PUSH_SETTLE_SECONDS = 5
    with PushService() as service:
        yield service


def subscribe(user, service: PushService, name: str = "phone") -> Device:
    device = Device(service.endpoint(name))
    info = device.subscription_info()
    devices.subscription_save(user=user, endpoint=info["endpoint"], user_agent=f"{name} browser", **info["keys"])
    return device


def later(seconds: float = 6):
    """A clock past the settle delay."""
    return timezone.now() + timedelta(seconds=seconds)


def run_jobs(owner, project, inline_tasks, *, ok: int = 0, failed: int = 0) -> list[Job]:
    jobs = make_drafts(project, ok)
    if failed:
        failing = make_provider(owner, name="Failing", fail_rate=1, fail_kind="permanent")
        jobs += make_drafts(project, failed, prompt="a doomed fox", provider=failing)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    return jobs


@pytest.mark.parametrize(
    "ok, failed, body",
    [
        (3, 0, "All 3 jobs finished."),
        (0, 2, "2 jobs failed."),
        (2, 1, "2 of 3 jobs finished, 1 failed."),
        (1, 0, "1 job finished."),
        (0, 1, "1 job failed."),
    ],
)
def test_a_finished_project_sends_one_notification_per_device_with_its_counts(
    owner, project, inline_tasks, push_service, ok, failed, body
):
    phone, laptop = subscribe(owner, push_service, "phone"), subscribe(owner, push_service, "laptop")
    jobs = run_jobs(owner, project, inline_tasks, ok=ok, failed=failed)
    assert Job.objects.filter(id__in=[j.id for j in jobs], status__in=[Status.COMPLETED, Status.FAILED]).count() == ok + failed

    assert outbox.step() == 0, "nothing is sent before the settle delay"
    assert push_service.received() == []

    outbox.step(now=later())
    outbox.step(now=later(8))
    for device in (phone, laptop):
        [message] = device.messages(push_service)
        assert message["title"] == "Project is done"
        assert message["body"] == body
        assert message["url"] == f"/projects/{project.id}/"
        assert message["tag"] == f"project-{project.id}"
        assert (message["total"], message["completed"], message["failed"]) == (ok + failed, ok, failed)
    run = ProjectRun.objects.get(project=project)
    assert (run.total, run.completed, run.failed) == (ok + failed, ok, failed) and run.closed_at
    assert set(PushOutbox.objects.values_list("outcome", flat=True)) == {"sent"}
    assert all(PushSubscription.objects.values_list("last_used_at", flat=True))


def test_a_burst_of_completions_gives_one_notification_and_each_later_finish_its_own(owner, project, inline_tasks, push_service):
    phone = subscribe(owner, push_service)
    first, second, third = make_drafts(project, 3)
    jobs_start(user=owner, project=project, job_ids=[first.id, second.id])
    assert outbox.step(now=later()) == 0, "work is pending: no finish"
    inline_tasks.run()
    # The first two finished long ago; a third job starts and finishes just now, inside
    # the settle window of the others: still one run, one notification.
    Job.objects.filter(id__in=[first.id, second.id]).update(finished_at=timezone.now() - timedelta(seconds=60))
    jobs_start(user=owner, project=project, job_ids=[third.id])
    inline_tasks.run()
    assert outbox.step(now=later(3)) == 0, "the last completion has not settled"
    outbox.step(now=later())
    outbox.step(now=later(10))
    assert [m["body"] for m in phone.messages(push_service)] == ["All 3 jobs finished."]

    # The project finishes again later: a new run, a new notification, with only its own jobs.
    run_jobs(owner, project, inline_tasks, ok=1)
    outbox.step(now=later(20))
    outbox.step(now=later(30))
    assert [m["body"] for m in phone.messages(push_service)] == ["All 3 jobs finished.", "1 job finished."]
    assert ProjectRun.objects.filter(project=project, closed_at__isnull=False).count() == 2


def test_a_retried_job_counts_once_in_the_run_that_ran_it(owner, inline_tasks, push_service):
    phone = subscribe(owner, push_service)
    flaky = make_provider(owner, name="Flaky", fail_rate=1, fail_kind="permanent")
    project = make_project(owner, flaky, model="demo-image")
    [job] = make_drafts(project, 1)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    outbox.step(now=later())
    flaky.options = {"latency_ms": 0}
    flaky.save()
    jobs_retry(user=owner, job_ids=[job.id])
    inline_tasks.run()
    outbox.step(now=later(20))
    assert [m["body"] for m in phone.messages(push_service)] == ["1 job failed.", "1 job finished."]


def test_the_finish_is_a_live_event_even_without_devices(owner, project, inline_tasks, push_service):
    run_jobs(owner, project, inline_tasks, ok=2)
    outbox.step(now=later())
    [event] = ProjectEvent.objects.filter(project=project, kind="project.finished")
    assert event.payload["title"] == "Project is done" and event.payload["body"] == "All 2 jobs finished."
    assert event.seq == ProjectEvent.objects.filter(project=project).order_by("-seq").first().seq
    assert push_service.received() == [] and PushOutbox.objects.count() == 0


def test_a_run_whose_failures_are_cleared_before_it_settles_closes_silently(owner, project, inline_tasks, push_service):
    phone = subscribe(owner, push_service)
    run_jobs(owner, project, inline_tasks, failed=2)
    assert ProjectRun.objects.get(project=project).closed_at is None
    assert failed_jobs_clear(user=owner, project_id=project.id)["cleared"] == 2
    outbox.step(now=later())
    assert ProjectRun.objects.get(project=project).closed_at is not None
    assert phone.messages(push_service) == [] and not ProjectEvent.objects.filter(kind="project.finished").exists()


def test_work_without_an_open_run_gets_one_from_the_safety_net(owner, project, inline_tasks, push_service):
    phone = subscribe(owner, push_service)
    jobs = make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    ProjectRun.objects.all().delete()  # as if the jobs were started before this feature existed
    assert project_runs.runs_open_missing() == 1
    assert project_runs.runs_open_missing() == 0
    run = ProjectRun.objects.get(closed_at__isnull=True)
    assert run.opened_at == min(Job.objects.filter(id__in=[j.id for j in jobs]).values_list("queued_at", flat=True))
    inline_tasks.run()
    outbox.step(now=later())
    assert [m["body"] for m in phone.messages(push_service)] == ["All 2 jobs finished."]


def test_a_gone_subscription_410_is_deleted_and_other_devices_still_get_theirs(owner, project, inline_tasks, push_service):
    phone, old_tablet = subscribe(owner, push_service, "phone"), subscribe(owner, push_service, "tablet")
    push_service.respond(old_tablet.endpoint, 410)
    run_jobs(owner, project, inline_tasks, ok=1)
    outbox.step(now=later())
    assert len(push_service.received(old_tablet.endpoint)) == 1
    assert list(PushSubscription.objects.values_list("endpoint", flat=True)) == [phone.endpoint]
    assert [m["body"] for m in phone.messages(push_service)] == ["1 job finished."]


def test_other_errors_are_retried_and_logged_without_the_endpoint_secret(owner, project, inline_tasks, push_service, caplog):
    phone = subscribe(owner, push_service)
    push_service.respond(phone.endpoint, 500)
    run_jobs(owner, project, inline_tasks, ok=1)
    with caplog.at_level(logging.INFO, logger="queue_app.notifications"):
        outbox.step(now=later())
    row = PushOutbox.objects.get()
    assert row.outcome == "" and row.attempts == 1 and row.next_try_at > later()
    secret = phone.endpoint.rsplit("/", 1)[1]
    assert "HTTP 500" in caplog.text and "127.0.0.1" in caplog.text and secret not in caplog.text

    push_service.respond(phone.endpoint, 201)
    outbox.step(now=later(60))
    assert [m["body"] for m in phone.messages(push_service)] == ["1 job finished."]
    assert PushOutbox.objects.get().outcome == "sent"


def test_two_queue_services_observing_the_same_finish_send_once(owner, project, inline_tasks, push_service):
    phone = subscribe(owner, push_service)
    run_jobs(owner, project, inline_tasks, ok=3)
    services_ = [QueueService(), QueueService()]
    start = threading.Barrier(2)
    errors = []

    def observe(service):
        from django.db import connection

        try:
            start.wait()
            for seconds in (6, 7, 8):
                service.step_notify(now=later(seconds))
                service.push_sender.drain()
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=observe, args=(s,)) for s in services_]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(push_service.received()) == 1
    assert [m["body"] for m in phone.messages(push_service)] == ["All 3 jobs finished."]
    assert ProjectEvent.objects.filter(kind="project.finished").count() == 1


def test_a_restart_between_the_finish_and_the_send_still_sends_once(owner, project, inline_tasks, push_service):
    phone = subscribe(owner, push_service)
    run_jobs(owner, project, inline_tasks, ok=2)
    # The first service records the finish and dies before sending.
    assert project_runs.runs_close_settled(now=later()) == 1
    assert push_service.received() == [] and PushOutbox.objects.get().outcome == ""
    # A fresh service (new process) picks the recorded finish up, once.
    restarted = QueueService()
    assert restarted.step_notify(now=later(7)) is True
    restarted.push_sender.drain()
    restarted.step_notify(now=later(8))
    another = QueueService()
    another.step_notify(now=later(9))
    another.push_sender.drain()
    assert [m["body"] for m in phone.messages(push_service)] == ["All 2 jobs finished."]


def test_a_sender_that_died_mid_send_leaves_the_row_to_another_after_its_claim(owner, project, inline_tasks, push_service):
    phone = subscribe(owner, push_service)
    run_jobs(owner, project, inline_tasks, ok=1)
    project_runs.runs_close_settled(now=later())
    ids, _ = outbox.outbox_claim(now=later())
    assert ids  # claimed, then the process died
    assert outbox.outbox_send_due(now=later(10)) == 0, "the claim still holds"
    outbox.outbox_send_due(now=later(6 + outbox.SEND_CLAIM_SECONDS + 1))
    assert len(phone.messages(push_service)) == 1


def test_the_queue_service_step_does_not_wait_for_a_slow_push_service(owner, project, inline_tasks, push_service):
    phone = subscribe(owner, push_service)
    release = push_service.hold(phone.endpoint)
    run_jobs(owner, project, inline_tasks, ok=1)
    service = QueueService()
    try:
        assert service.step_notify(now=later()) is True
        # The step returned while the push is still waiting for the push service.
        assert service.push_sender.futures and not any(f.done() for f in service.push_sender.futures)
        assert PushOutbox.objects.get().outcome == ""
        assert service.step_notify(now=later(7)) is False, "the claimed row is not sent twice"
        release.set()
        service.push_sender.drain()
    finally:
        release.set()
        service.push_sender.close()
    assert [m["body"] for m in phone.messages(push_service)] == ["1 job finished."]
    assert PushOutbox.objects.get().outcome == "sent"


def test_the_push_is_signed_with_our_vapid_key_and_asks_the_service_to_keep_it(owner, project, inline_tasks, push_service):
    subscribe(owner, push_service)
    run_jobs(owner, project, inline_tasks, ok=1)
    outbox.step(now=later())
    [push] = push_service.received()
    public, _ = vapid.vapid_keys()
    assert push.headers["authorization"].startswith("vapid t=")
    assert f"k={public}" in push.headers["authorization"]
    assert Vapid02.verify(push.headers["authorization"]) is True
    assert push.headers["ttl"] == str(outbox.TTL_SECONDS)
    assert push.headers["topic"] == f"project-{project.id}"


def test_vapid_keys_are_generated_once_and_the_private_key_is_stored_encrypted(db):
    public, private = vapid.vapid_keys()
    assert vapid.vapid_keys() == (public, private)
    row = VapidKeys.objects.get()
    assert row.public_key == public
    assert private not in row.private_key_encrypted and crypto.decrypt(row.private_key_encrypted) == private
    assert vapid._public_of(Vapid02.from_string(private)) == public


def test_concurrent_first_starts_converge_on_one_key_pair(db):
    pairs, start = [], threading.Barrier(4)

    def first_start():
        from django.db import connection

        try:
            start.wait()
            pairs.append(vapid.vapid_keys())
        finally:
            connection.close()

    threads = [threading.Thread(target=first_start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(pairs) == 4 and len(set(pairs)) == 1
    assert VapidKeys.objects.count() == 1


def test_vapid_keys_from_the_environment_win_and_nothing_is_stored(db, settings):
    fresh = Vapid02()
    fresh.generate_keys()
    settings.VAPID_PRIVATE_KEY = vapid._private_raw(fresh)
    settings.VAPID_PUBLIC_KEY = vapid._public_of(fresh)
    assert vapid.vapid_keys() == (settings.VAPID_PUBLIC_KEY, settings.VAPID_PRIVATE_KEY)
    assert VapidKeys.objects.count() == 0


def test_a_stored_endpoint_that_became_unsafe_is_never_called(owner, project, inline_tasks, push_service, settings):
    phone = subscribe(owner, push_service)
    settings.OUTBOUND_ALLOWLIST = []  # loopback is private again
    run_jobs(owner, project, inline_tasks, ok=1)
    outbox.step(now=later())
    assert push_service.received() == [] and PushOutbox.objects.get().outcome == "failed"
    assert PushSubscription.objects.filter(endpoint=phone.endpoint).exists()


@pytest.mark.parametrize(
    "endpoint",
    ["http://10.0.0.1/push/x", "https://169.254.169.254/latest", "ftp://example.com/x", "not a url"],
)
def test_subscribing_refuses_endpoints_the_outbound_guard_refuses(owner, endpoint, settings):
    settings.OUTBOUND_ALLOWLIST = []
    keys = Device("https://example.invalid/x").subscription_info()["keys"]
    with pytest.raises(devices.BadSubscription):
        devices.subscription_save(user=owner, endpoint=endpoint, **keys)
    assert PushSubscription.objects.count() == 0
