"""Detached polling: cadences, claims, re-reads, multi-output layers, the timeout and its
reset, tolerated poll errors, the stale-task-id retry, and an end-to-end run with real
worker processes against a loopback fake provider."""

import json
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import requests
import responses
from django.conf import settings as django_settings
from django.utils import timezone

from queue_app.engine import snapshot, transitions
from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.providers.base import Running
from queue_app.queue_service import poll_pool, poller, recovery
from queue_app.queue_service.loop import QueueService
from queue_app.services.jobs import failed_jobs_clear, jobs_retry, jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider
from tests.engine_helpers import inflight, poll_once
from tests.fakes.async_provider import FakeAsyncProvider, png
from tests.fakes.dns import use_fake_dns
from tests.fakes.provider_shapes import civitai_workflow, replicate_prediction, rh_result, rh_task

pytestmark = pytest.mark.django_db(transaction=True)

RH = "https://www.runninghub.ai/openapi/v2"
RH_SUBMIT = f"{RH}/rhart-image-n-pro/text-to-image"
RH_QUERY = f"{RH}/query"
CIVITAI = "https://orchestration.civitai.com/v2/consumer/workflows"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


def provider_for(owner, family, **options):
    provider = make_provider(owner, name=family, family=family, concurrency=4, **options)
    provider.api_key = f"{family}-key-123456"
    provider.save()
    return provider


def started(owner, family, model, inline_tasks, **options):
    """A job started and executed until its adapter handed back a task id."""
    provider = provider_for(owner, family, **options)
    project = make_project(owner, provider, model=model)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job.refresh_from_db()
    return job


def detached(owner, family, *, task_id="task-1", at=None, model="", provider=None, slot=0):
    """A detached job written directly (for tests that fake the adapter)."""
    provider = provider or provider_for(owner, family)
    project = make_project(owner, provider, model=model)
    [job] = make_drafts(project)
    at = at or timezone.now()
    Job.objects.filter(id=job.id).update(
        status=Status.PROCESSING,
        active_provider=provider,
        slot=slot,
        lease_token=uuid.uuid4(),
        task_id=task_id,
        task_observed_at=at,
        next_poll_at=at,
        attempts=1,
        resolved=snapshot.build(job, project, provider),
    )
    # The attempt its submit left, waiting at the provider (its remote phase).
    JobAttempt.objects.create(job=job, number=1, worker="w", task_id=task_id, outcome="detached", phase="remote", detached_at=at)
    job.refresh_from_db()
    return job


# --- cadence ------------------------------------------------------------------------


@responses.activate
def test_a_detached_job_keeps_its_slot_and_is_polled_every_30_seconds(owner, inline_tasks):
    responses.add(responses.POST, RH_SUBMIT, json=rh_task(task_id="T30"))
    responses.add(responses.POST, RH_QUERY, json=rh_task(task_id="T30", status="RUNNING"))
    job = started(owner, "runninghub", "rhart-image-n-pro/text-to-image", inline_tasks)
    assert job.status == Status.PROCESSING and job.task_id == "T30" and job.slot == 0 and job.lease_expires_at is None
    assert JobAttempt.objects.get(job=job).task_id == "T30"
    t0 = job.task_observed_at
    assert job.next_poll_at == t0 + timedelta(seconds=30)
    assert poll_once(now=t0 + timedelta(seconds=29)) == 0
    assert poll_once(now=t0 + timedelta(seconds=30)) == 1
    job.refresh_from_db()
    assert job.next_poll_at == t0 + timedelta(seconds=60) and job.poll_claimed_until is None
    assert poll_once(now=t0 + timedelta(seconds=59)) == 0
    assert len([c for c in responses.calls if c.request.url == RH_QUERY]) == 1


@responses.activate
def test_civitai_jobs_are_polled_every_5_seconds_by_the_queue_services_poll_step(owner, inline_tasks):
    responses.add(responses.POST, CIVITAI + "?wait=0", json=civitai_workflow("processing", workflow_id="wf_5"), status=202)
    responses.add(responses.GET, f"{CIVITAI}/wf_5", json=civitai_workflow("processing", workflow_id="wf_5"))
    job = started(owner, "civitai", "urn:air:sdxl:checkpoint:civitai:101055@128078", inline_tasks)
    t0 = job.task_observed_at
    assert job.next_poll_at == t0 + timedelta(seconds=5)
    service = QueueService()
    try:
        for offset, expected in ((4, False), (5, True), (9, False), (10, True)):
            assert service.step_poll(now=t0 + timedelta(seconds=offset)) is expected
            service.poller.wait(timeout=30)
    finally:
        service.poller.close()
    job.refresh_from_db()
    assert job.next_poll_at == t0 + timedelta(seconds=15) and job.status == Status.PROCESSING
    assert len([c for c in responses.calls if c.request.method == "GET"]) == 2


def test_two_pollers_never_claim_the_same_job(owner):
    job = detached(owner, "demo", task_id="demo:x:0")
    now = timezone.now()
    first, second = poller.claim_due(now=now), poller.claim_due(now=now)
    assert [row[0] for row in first] == [job.id] and second == []
    # the claim lapses when its poller dies, and another cycle takes the job
    later = now + timedelta(seconds=poller.POLL_CLAIM_SECONDS + 1)
    assert [row[0] for row in poller.claim_due(now=later)] == [job.id]


def test_a_slow_provider_does_not_delay_the_others(owner, monkeypatch):
    slow = detached(owner, "runninghub", task_id="slow")
    fast = detached(owner, "replicate", task_id="fast")
    release = threading.Event()

    class SlowAdapter:
        @staticmethod
        def check(task_id, job):
            release.wait(30)
            return Running()

    class FastAdapter:
        @staticmethod
        def check(task_id, job):
            return Running(progress=0.5)

    monkeypatch.setattr(poller, "adapter_for", lambda family: SlowAdapter if family == "runninghub" else FastAdapter)
    pool = poll_pool.Poller(parallelism=4)
    try:
        assert pool.step() == 2
        deadline = time.monotonic() + 20
        # the fast check's result is written before its thread counts itself done
        while time.monotonic() < deadline and (Job.objects.get(id=fast.id).progress != 0.5 or inflight(pool) != 1):
            time.sleep(0.05)
        fast.refresh_from_db()
        slow.refresh_from_db()
        assert fast.progress == 0.5 and fast.poll_claimed_until is None  # applied while the slow one hangs
        assert slow.poll_claimed_until is not None and inflight(pool) == 1
    finally:
        release.set()
        pool.wait(timeout=30)
        pool.close()
    assert Job.objects.get(id=slow.id).poll_claimed_until is None


def test_a_poll_thread_takes_the_next_due_check_when_its_own_ends(owner, monkeypatch):
    """Due work left over after a step is not left for the next step (a second later in
    the queue service): each finished check claims the next one."""
    crowded = provider_for(owner, "demo")
    jobs = [detached(owner, "demo", task_id=f"demo:{n}:0", provider=crowded, slot=n) for n in range(10)]

    class SlowishAdapter:
        @staticmethod
        def check(task_id, job):
            time.sleep(0.05)
            return Running(progress=0.25)

    monkeypatch.setattr(poller, "adapter_for", lambda family: SlowishAdapter)
    pool = poll_pool.Poller(parallelism=2, per_provider=2)
    try:
        assert pool.step() == 2  # the only step: two threads for ten due jobs
        deadline = time.monotonic() + 20
        while Job.objects.filter(id__in=[job.id for job in jobs], progress=0.25).count() < 10:
            assert time.monotonic() < deadline, "the threads did not refill themselves"
            time.sleep(0.05)
        pool.wait(timeout=10)
    finally:
        pool.close()
    assert Job.objects.filter(id__in=[job.id for job in jobs], poll_claimed_until__isnull=False).count() == 0


def test_a_provider_gets_at_most_half_the_poll_threads(owner):
    crowded = provider_for(owner, "demo")
    for n in range(6):
        detached(owner, "demo", task_id=f"demo:{n}:0", provider=crowded, slot=n)
    other = detached(owner, "demo", task_id="demo:other:0")
    claimed = poller.claim_due(limit=8, busy={crowded.id: 1}, per_provider=4)
    assert sorted(row[2] for row in claimed) == [crowded.id] * 3 + [other.active_provider_id]


# --- re-read before acting ----------------------------------------------------------------


@responses.activate
@pytest.mark.parametrize("meanwhile", ["cleared", "retried"])
def test_a_job_cleared_or_retried_between_claim_and_apply_is_left_alone(owner, inline_tasks, meanwhile):
    job = detached(owner, "runninghub", task_id="T1", model="rhart-image-n-pro/text-to-image")
    [(job_id, token, _)] = poller.claim_due(now=timezone.now())

    def provider_answers(request):
        # While the HTTP check is in flight, another cycle times the job out and the
        # user clears it, or retries it.
        assert transitions.job_fail(job_id, token, reason="timed out", error_class="timeout")
        if meanwhile == "cleared":
            failed_jobs_clear(user=owner)
        else:
            jobs_retry(user=owner, job_ids=[job_id])
        return (200, {}, json.dumps(rh_task(task_id="T1", status="FAILED", code="433", message="bad")))

    responses.add_callback(responses.POST, RH_QUERY, callback=provider_answers)
    assert poller.check_job(job_id, token) == "skipped"
    if meanwhile == "cleared":
        assert not Job.objects.filter(id=job_id).exists()
    else:
        job.refresh_from_db()
        assert job.status in (Status.PENDING, Status.PROCESSING) and job.error == ""
        assert not JobAttempt.objects.filter(job=job, worker="poller").exists()


# --- multi-output -------------------------------------------------------------------------


def test_a_layered_result_becomes_a_base_and_16_layers_and_a_retry_overwrites_with_fewer(owner, inline_tasks):
    job = started(owner, "demo", "demo-layers", inline_tasks, mode="async")
    Job.objects.filter(id=job.id).update(params={"layers": 16})
    Job.objects.filter(id=job.id).update(resolved={**job.resolved, "params": {"layers": 16}})
    assert job.task_id and poll_once(now=timezone.now() + timedelta(seconds=5)) == 1
    inline_tasks.run()  # the collection
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.slot is None
    items = list(AlbumItem.objects.filter(job=job).order_by("output_index"))
    assert [i.output_index for i in items] == list(range(17))
    assert [i.role for i in items] == ["composite"] + ["layer"] * 16
    first_files = {i.output_index: Path(django_settings.MEDIA_ROOT) / i.file.name for i in items}
    assert all(path.exists() for path in first_files.values())

    # The retry: a fresh submission whose result has 5 layers.
    Job.objects.filter(id=job.id).update(status=Status.FAILED, task_id="", params={"layers": 5})
    jobs_retry(user=owner, job_ids=[job.id])
    inline_tasks.run()
    assert poll_once(now=timezone.now() + timedelta(seconds=5)) == 1
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED
    items = list(AlbumItem.objects.filter(job=job).order_by("output_index"))
    assert [i.output_index for i in items] == list(range(6)) and [i.role for i in items] == ["composite"] + ["layer"] * 5
    assert AlbumItem.objects.filter(project=job.project).count() == 6  # overwritten, not a second set
    assert not any(first_files[n].exists() for n in range(6, 17))  # the dropped layers' files are gone


# --- timeout ------------------------------------------------------------------------------


def test_a_task_without_a_result_fails_after_the_processing_timeout_with_a_readable_reason(owner, settings):
    assert settings.JOB_PROCESSING_TIMEOUT_MS == 7_200_000
    now = timezone.now()
    stuck = detached(owner, "demo", task_id="demo:x:99999999999999", at=now - timedelta(hours=2, seconds=1))
    within = detached(owner, "demo", task_id="demo:y:99999999999999", at=now - timedelta(hours=1, minutes=59))
    assert poll_once(now=now) == 2
    stuck.refresh_from_db()
    within.refresh_from_db()
    assert stuck.status == Status.FAILED and stuck.error_class == "timeout" and stuck.slot is None
    assert "no result within 120 minutes" in stuck.error
    assert stuck.task_id == "demo:x:99999999999999"  # kept: a retry looks at the task first
    assert JobAttempt.objects.get(job=stuck).outcome == "timeout"
    assert within.status == Status.PROCESSING


def test_the_recovery_scan_restarts_the_timeout_window(owner):
    now = timezone.now()
    job = detached(owner, "demo", task_id="demo:x:99999999999999", at=now - timedelta(hours=3))
    Job.objects.filter(id=job.id).update(next_poll_at=now + timedelta(minutes=5))
    recovery.recover()
    job.refresh_from_db()
    assert job.task_observed_at >= now and job.next_poll_at <= timezone.now()
    assert poll_once(now=timezone.now()) == 1
    job.refresh_from_db()
    assert job.status == Status.PROCESSING  # still running, no longer over the limit


# --- poll errors and dead tasks -----------------------------------------------------------


@responses.activate
def test_transient_poll_errors_do_not_fail_the_task(owner, inline_tasks):
    job = detached(owner, "runninghub", task_id="T1", model="rhart-image-n-pro/text-to-image")
    url = "https://rh-images.example.com/output/abc.png"
    answers = [
        dict(status=500, body="oops"),
        dict(body=requests.ConnectionError("reset")),
        dict(status=200, body="{not json"),
        dict(status=200, json=rh_task(task_id="T1", status="SUCCESS", results=[rh_result(url)])),
    ]
    now = timezone.now()
    for n, answer in enumerate(answers):
        responses.replace(responses.POST, RH_QUERY, **answer) if n else responses.add(responses.POST, RH_QUERY, **answer)
        now += timedelta(seconds=31)
        assert poll_once(now=now) == 1
        job.refresh_from_db()
        if n < 3:
            assert job.status == Status.PROCESSING and job.poll_failures == n + 1
    responses.add(responses.GET, url, body=png(), content_type="image/png")
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and AlbumItem.objects.filter(job=job).count() == 1


@responses.activate
def test_a_remote_404_for_a_known_task_is_a_dead_task(owner, inline_tasks):
    job = detached(owner, "replicate", task_id="gone1", model="black-forest-labs/flux-schnell")
    responses.add(responses.GET, "https://api.replicate.com/v1/predictions/gone1", status=404, json={"detail": "Not found."})
    assert poll_once(now=timezone.now()) == 1
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_class == "permanent" and "404" in job.error and job.task_id == ""


@responses.activate
def test_a_rejected_key_while_polling_pauses_the_provider_and_keeps_the_task(owner, inline_tasks):
    job = detached(owner, "replicate", task_id="p401", model="black-forest-labs/flux-schnell")
    url = "https://api.replicate.com/v1/predictions/p401"
    responses.add(responses.GET, url, status=401, json={"title": "Unauthenticated", "detail": "Invalid token."})
    assert poll_once(now=timezone.now()) == 1
    job.refresh_from_db()
    provider = job.active_provider
    provider.refresh_from_db()
    assert provider.paused and "rejected the API key" in provider.paused_reason
    assert job.status == Status.PROCESSING and job.task_id == "p401" and job.poll_failures == 1
    # The owner fixes the key: the paid-for task is still collected.
    responses.replace(
        responses.GET,
        url,
        json=replicate_prediction("succeeded", output=["https://replicate.delivery/x.png"], prediction_id="p401"),
    )
    responses.add(responses.GET, "https://replicate.delivery/x.png", body=png(), content_type="image/png")
    assert poll_once(now=timezone.now() + timedelta(seconds=31)) == 1
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and AlbumItem.objects.filter(job=job).count() == 1


@responses.activate
def test_a_provider_that_keeps_refusing_checks_fails_the_job_after_three(owner, inline_tasks):
    job = detached(owner, "replicate", task_id="p403", model="black-forest-labs/flux-schnell")
    responses.add(
        responses.GET, "https://api.replicate.com/v1/predictions/p403", status=403, json={"detail": "You do not have access."}
    )
    now = timezone.now()
    for n in range(1, poller.POLL_REFUSALS_TO_FAIL + 1):
        assert poll_once(now=now) == 1
        now += timedelta(seconds=31)
        job.refresh_from_db()
        if n < poller.POLL_REFUSALS_TO_FAIL:
            assert job.status == Status.PROCESSING and job.poll_failures == n
    assert job.status == Status.FAILED and job.error_class == "permanent" and job.task_id == ""
    assert job.error.startswith("the provider refused 3 status checks in a row for task p403") and "403" in job.error
    assert job.slot is None
    assert JobAttempt.objects.get(job=job).outcome == "permanent"


@responses.activate
def test_an_output_url_that_redirects_to_a_private_address_fails_the_job_readably(owner, inline_tasks):
    job = detached(owner, "replicate", task_id="p1", model="black-forest-labs/flux-schnell")
    out = "https://replicate.delivery/xezq/p1/out.png"
    prediction = {"id": "p1", "status": "succeeded", "output": [out]}
    responses.add(responses.GET, "https://api.replicate.com/v1/predictions/p1", json=prediction)
    responses.add(responses.GET, out, status=302, headers={"Location": "https://metadata.example/computeMetadata/v1/"})
    poll_once(now=timezone.now())
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_class == "local" and "address not allowed" in job.error
    assert job.task_id == "p1"  # kept: the provider did its part
    assert not AlbumItem.objects.filter(job=job).exists()


@responses.activate
def test_a_huge_output_is_capped(owner, inline_tasks, settings):
    settings.OUTBOUND_MAX_BYTES = 10_000
    job = detached(owner, "replicate", task_id="p2", model="black-forest-labs/flux-schnell")
    out = "https://replicate.delivery/xezq/p2/out.png"
    responses.add(
        responses.GET, "https://api.replicate.com/v1/predictions/p2", json={"id": "p2", "status": "succeeded", "output": out}
    )
    responses.add(responses.GET, out, body=b"\0" * 50_000, content_type="image/png")
    poll_once(now=timezone.now())
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.FAILED and "cap" in job.error
    assert not list((Path(settings.MEDIA_ROOT) / "tmp").glob("*.part"))


# --- retry of a job that still has a task id ------------------------------------------------


def failed_locally(owner, inline_tasks, task_id):
    responses.add(responses.POST, RH_SUBMIT, json=rh_task(task_id=task_id))
    job = started(owner, "runninghub", "rhart-image-n-pro/text-to-image", inline_tasks)
    assert transitions.job_fail(job.id, job.lease_token, reason="disk full", error_class="local")
    responses.calls.reset()
    return job


@responses.activate
def test_a_retry_adopts_a_finished_task_without_submitting_or_downloading_twice(owner, inline_tasks):
    job = failed_locally(owner, inline_tasks, "T-old")
    url = "https://rh-images.example.com/output/old.png"
    responses.add(responses.POST, RH_QUERY, json=rh_task(task_id="T-old", status="SUCCESS", results=[rh_result(url)]))
    responses.add(responses.GET, url, body=png(), content_type="image/png")
    jobs_retry(user=owner, job_ids=[job.id])
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.task_id == "T-old"
    urls = [call.request.url for call in responses.calls]
    assert RH_SUBMIT not in urls and urls.count(url) == 1 and urls.count(RH_QUERY) == 1


@responses.activate
def test_a_retry_adopts_a_task_that_is_still_running(owner, inline_tasks):
    job = failed_locally(owner, inline_tasks, "T-run")
    responses.add(responses.POST, RH_QUERY, json=rh_task(task_id="T-run", status="RUNNING"))
    jobs_retry(user=owner, job_ids=[job.id])
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.task_id == "T-run" and job.next_poll_at is not None
    assert RH_SUBMIT not in [call.request.url for call in responses.calls]


@responses.activate
def test_a_retry_of_a_dead_task_clears_the_task_id_and_submits_fresh(owner, inline_tasks):
    job = failed_locally(owner, inline_tasks, "T-dead")
    responses.add(responses.POST, RH_QUERY, json=rh_task(task_id="", status="", code="807", message="APIKEY_TASK_NOT_FOUND"))
    responses.replace(responses.POST, RH_SUBMIT, json=rh_task(task_id="T-new"))
    jobs_retry(user=owner, job_ids=[job.id])
    inline_tasks.run()
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.task_id == "T-new"
    assert [call.request.url for call in responses.calls].count(RH_SUBMIT) == 1


# --- end to end with real processes -------------------------------------------------------


@pytest.mark.processes
def test_an_async_provider_runs_end_to_end_through_real_workers(owner, tmp_path, settings):
    with FakeAsyncProvider(polls_before_done=2, layers=4) as fake:
        settings.OUTBOUND_ALLOWLIST = [f"http://{fake.host}"]
        provider = make_provider(owner, name="RH fake", family="runninghub", concurrency=2)
        provider.api_key = "rh-test-key-123"
        provider.base_url = f"{fake.url}/openapi/v2"
        provider.save()
        project = make_project(owner, provider, model="workflow-layers")
        jobs = make_drafts(project, 3, params={"workflow_id": "1987", "prompt_node": {"nodeId": "6", "fieldName": "text"}})
        logs = tmp_path / "logs"
        # Both sides read the poll cycle: the worker that detaches sets the first check.
        running = [procs.qcluster(logs, workers=2, DETACHED_POLL_SECONDS=1), procs.queue_service(logs, DETACHED_POLL_SECONDS=1)]
        try:
            jobs_start(user=owner, project=project, all_drafts=True)
            procs.wait_for(
                lambda: Job.objects.filter(status=Status.COMPLETED).count() == 3,
                timeout=120,
                message="3 completed jobs (" + "; ".join(p.name for p in running) + ")",
            )
        finally:
            for proc in running:
                proc.stop()
        assert fake.hits["submit"] == 3  # one submission per job, never twice
        assert fake.hits["query"] >= 9  # each task polled until SUCCESS
        assert fake.hits["download"] == 15
        assert {body["nodeInfoList"][0]["fieldValue"] for body in fake.bodies} == {job.prompt for job in jobs}
    for job in jobs:
        items = list(AlbumItem.objects.filter(job=job).order_by("output_index"))
        assert [i.role for i in items] == ["composite", "layer", "layer", "layer", "layer"]
        assert all(i.content_type == "image/png" and i.width == 32 for i in items)
    assert Job.objects.filter(slot__isnull=False).count() == 0
