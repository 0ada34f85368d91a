"""Cancelling jobs: a pending job fails at once with reason "cancelled"; a running call's
result is fenced out (no album item, no retry); a detached task is cancelled at its
provider (Replicate, RunningHub, OpenAI video, ComfyUI) and its slot freed at once; the
processing timeout cancels the remote task the same way; cancelled jobs retry and clear
like failed ones. Then the API, MCP and the pages."""

import json
import threading
import time
import uuid
from datetime import timedelta

import pytest
import responses
from django.db import connection
from django.test import Client
from django.utils import timezone

from comfy_app.models import ComfyInstance
from comfy_app.runner import check
from queue_app.engine import heartbeats, snapshot
from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.providers import demo
from queue_app.providers.base import Finished, Submitted
from queue_app.queue_service import poller
from queue_app.selectors.job_list import job_state
from queue_app.services.jobs import failed_jobs_clear, jobs_cancel, jobs_retry, jobs_start
from queue_app.web import tokens
from tests.conftest import make_drafts, make_project, make_provider
from tests.engine_helpers import poll_once
from tests.fakes.async_provider import FakeAsyncProvider
from tests.fakes.comfyui import WORKFLOW, FakeComfyUI, Script
from tests.fakes.dns import use_fake_dns
from tests.fakes.provider_shapes import replicate_prediction

pytestmark = pytest.mark.django_db(transaction=True)

REPLICATE = "https://api.replicate.com/v1/predictions"
RH_CANCEL = "https://www.runninghub.ai/task/openapi/cancel"
OPENAI_VIDEOS = "https://api.openai.com/v1/videos"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


def job_of(job) -> Job:
    return Job.objects.get(id=job.id)


def provider_for(owner, family, **options):
    provider = make_provider(owner, name=family, family=family, concurrency=2, **options)
    provider.api_key = f"{family}-key-123456"
    provider.save()
    return provider


def detached(owner, family, *, task_id, model="", at=None, kind="image"):
    """A job detached at `family` with remote task `task_id`, written directly."""
    provider = provider_for(owner, family)
    project = make_project(owner, provider, model=model, kind=kind)
    [job] = make_drafts(project)
    at = at or timezone.now()
    Job.objects.filter(id=job.id).update(
        status=Status.PROCESSING,
        active_provider=provider,
        slot=0,
        lease_token=uuid.uuid4(),
        task_id=task_id,
        task_observed_at=at,
        next_poll_at=at,
        attempts=1,
        resolved=snapshot.build(job, project, provider),
    )
    # The attempt its submit left, waiting at the provider (its remote phase).
    JobAttempt.objects.create(job=job, number=1, worker="w", outcome="detached", phase="remote", task_id=task_id, detached_at=at)
    return job_of(job)


def assert_cancelled(job):
    job = job_of(job)
    assert job.status == Status.FAILED and job.error == "cancelled" and job.error_class == "cancelled"
    assert job.slot is None and job.active_provider_id is None and job.lease_token is None
    return job


# --- the engine -----------------------------------------------------------------------


def test_a_pending_job_fails_at_once_with_reason_cancelled_and_others_are_skipped(owner, outsider, project, inline_tasks):
    running, pending, draft = make_drafts(project, 3)
    jobs_start(user=owner, project=project, job_ids=[running.id, pending.id])
    assert [job_of(running).status, job_of(pending).status] == [Status.PROCESSING, Status.PENDING]  # concurrency 1
    result = jobs_cancel(user=outsider, job_ids=[pending.id])
    assert result == {"cancelled": 0, "skipped": 1} and job_of(pending).status == Status.PENDING

    result = jobs_cancel(user=owner, job_ids=[pending.id, draft.id, pending.id])
    assert result == {"cancelled": 1, "skipped": 1}
    job = assert_cancelled(pending)
    assert job.finished_at is not None and not JobAttempt.objects.filter(job=job).exists()
    assert job_of(draft).status == Status.DRAFT and job_of(running).status == Status.PROCESSING
    assert jobs_cancel(user=owner, job_ids=[pending.id]) == {"cancelled": 0, "skipped": 1}  # twice: harmless
    # the running one finishes; nothing dispatches the cancelled one after it
    inline_tasks.run()
    assert job_of(running).status == Status.COMPLETED and job_of(pending).status == Status.FAILED


def test_a_cancelled_running_job_leaves_no_album_item_and_is_not_retried(owner, project, inline_tasks, monkeypatch):
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    [waiting] = make_drafts(project)
    jobs_start(user=owner, project=project, job_ids=[waiting.id])
    seen = {}

    def submit_then_cancelled(request):
        # The user cancels (from the web process: another thread) while the provider
        # works; the provider then answers anyway.
        def cancel():
            seen["result"] = jobs_cancel(user=owner, job_ids=[request.job_id])
            seen["slot_free"] = Job.objects.get(id=request.job_id).slot is None
            connection.close()

        user = threading.Thread(target=cancel)
        user.start()
        user.join()
        return Finished(outputs=demo.outputs_for(request))

    monkeypatch.setattr(demo, "submit", submit_then_cancelled)
    inline_tasks.run(limit=1)
    assert seen == {"result": {"cancelled": 1, "skipped": 0}, "slot_free": True}
    job = assert_cancelled(job)
    assert not AlbumItem.objects.filter(job=job).exists()
    assert [a.outcome for a in JobAttempt.objects.filter(job=job)] == ["cancelled"]
    assert job.attempts == 1  # not requeued: no retry of a cancelled job
    # the freed slot went to the next pending job
    assert job_of(waiting).status in (Status.PROCESSING, Status.COMPLETED)


def test_a_task_submitted_while_its_job_was_cancelled_is_cancelled_at_the_provider(owner, inline_tasks, monkeypatch):
    provider = provider_for(owner, "demo")
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    cancelled = []
    monkeypatch.setattr(demo, "cancel", lambda task_id, request: cancelled.append(task_id), raising=False)

    def submit_async(request):
        jobs_cancel(user=owner, job_ids=[request.job_id])
        return Submitted(task_id="demo:late:1")

    monkeypatch.setattr(demo, "submit", submit_async)
    inline_tasks.run(limit=1)
    assert_cancelled(job)
    assert cancelled == ["demo:late:1"]  # nobody would ever poll it: stopped at once


@responses.activate
def test_a_detached_replicate_task_is_cancelled_at_replicate_and_its_slot_freed(owner):
    job = detached(owner, "replicate", task_id="pred42", model="black-forest-labs/flux-schnell")
    responses.add(responses.POST, f"{REPLICATE}/pred42/cancel", json=replicate_prediction("canceled", prediction_id="pred42"))
    assert jobs_cancel(user=owner, job_ids=[job.id]) == {"cancelled": 1, "skipped": 0}
    job = assert_cancelled(job)
    [call] = responses.calls
    assert call.request.headers["Authorization"] == "Bearer replicate-key-123456"
    assert job.task_id == "pred42"  # kept: a retry checks it first, finds it canceled, submits anew
    # Its one attempt, waiting at Replicate, ends cancelled: no second row for the cancel.
    attempts = list(JobAttempt.objects.filter(job=job).order_by("id").values_list("number", "phase", "outcome"))
    assert attempts == [(1, "remote", "cancelled")]
    assert poller.claim_due(now=timezone.now() + timedelta(hours=1)) == []  # no longer polled


@responses.activate
def test_a_detached_runninghub_task_is_cancelled_with_its_key_in_the_body(owner):
    job = detached(owner, "runninghub", task_id="2047154150516862978", model="rhart-image-n-pro/text-to-image")
    responses.add(responses.POST, RH_CANCEL, json={"code": 0, "msg": "success", "data": None})
    jobs_cancel(user=owner, job_ids=[job.id])
    assert_cancelled(job)
    [call] = responses.calls
    assert json.loads(call.request.body) == {"apiKey": "runninghub-key-123456", "taskId": "2047154150516862978"}


@responses.activate
def test_a_detached_openai_video_is_deleted(owner):
    job = detached(owner, "openai", task_id="video_123", model="sora-2", kind="video")
    responses.add(responses.DELETE, f"{OPENAI_VIDEOS}/video_123", json={"id": "video_123", "deleted": True})
    jobs_cancel(user=owner, job_ids=[job.id])
    assert_cancelled(job)
    assert [call.request.method for call in responses.calls] == ["DELETE"]


@responses.activate
def test_a_refused_remote_cancel_is_logged_and_the_job_is_cancelled_anyway(owner, caplog):
    job = detached(owner, "replicate", task_id="pred500", model="black-forest-labs/flux-schnell")
    responses.add(responses.POST, f"{REPLICATE}/pred500/cancel", status=500, json={"detail": "boom"})
    assert jobs_cancel(user=owner, job_ids=[job.id]) == {"cancelled": 1, "skipped": 0}
    assert_cancelled(job)
    assert "cancelling the remote task failed" in caplog.text and "replicate-key" not in caplog.text


@responses.activate
def test_the_processing_timeout_cancels_the_remote_task_too(owner, settings):
    now = timezone.now()
    job = detached(owner, "replicate", task_id="slow1", model="black-forest-labs/flux-schnell", at=now - timedelta(hours=3))
    responses.add(responses.POST, f"{REPLICATE}/slow1/cancel", json=replicate_prediction("canceled", prediction_id="slow1"))
    assert poll_once(now=now) == 1
    job = job_of(job)
    assert job.status == Status.FAILED and job.error_class == "timeout" and job.slot is None
    assert [call.request.url for call in responses.calls] == [f"{REPLICATE}/slow1/cancel"]


@responses.activate
def test_a_cancelled_job_retries_checks_its_cancelled_task_and_submits_anew(owner, inline_tasks):
    job = detached(owner, "replicate", task_id="old1", model="black-forest-labs/flux-schnell")
    responses.add(responses.POST, f"{REPLICATE}/old1/cancel", json=replicate_prediction("canceled", prediction_id="old1"))
    jobs_cancel(user=owner, job_ids=[job.id])
    assert job_state(job_of(job), providers={}, live={}, now=timezone.now())[0] == "cancelled"

    responses.add(responses.GET, f"{REPLICATE}/old1", json=replicate_prediction("canceled", prediction_id="old1"))
    responses.add(responses.POST, REPLICATE, json=replicate_prediction("starting", prediction_id="new1"), status=201)
    assert jobs_retry(user=owner, job_ids=[job.id]) == {"retried": [str(job.id)]}
    assert job_of(job).error == ""
    inline_tasks.run()
    job = job_of(job)
    assert job.status == Status.PROCESSING and job.task_id == "new1"


def test_cancelled_jobs_are_cleared_like_failed_ones(owner, project):
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    jobs_cancel(user=owner, job_ids=[job.id])
    assert failed_jobs_clear(user=owner, project_id=project.id)["cleared"] == 1
    assert not Job.objects.filter(id=job.id).exists()


# --- ComfyUI ----------------------------------------------------------------------------


@pytest.fixture
def comfy(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    settings.COMFY_WEBSOCKET = False
    server = FakeComfyUI().start()
    yield server
    server.stop()


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("never got there")


def test_comfyui_prompts_are_interrupted_when_running_and_deleted_when_queued(owner, comfy, inline_tasks):
    project = make_project(owner, kind="comfyui", name="Comfy")
    instance = ComfyInstance.objects.create(project=project, base_url=comfy.url, workflow=WORKFLOW)
    comfy.plan(Script(kind="hang"), Script(kind="hang"))
    running, queued = make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    wait_for(lambda: comfy.running is not None and len(comfy.pending) == 1)
    queued_prompt = job_of(queued).task_id
    assert comfy.pending[0][1] == queued_prompt

    assert jobs_cancel(user=owner, job_ids=[queued.id]) == {"cancelled": 1, "skipped": 0}
    assert_cancelled(queued)
    assert comfy.pending == []  # deleted from ComfyUI's queue
    assert comfy.running is not None  # the other job's prompt runs on

    jobs_cancel(user=owner, job_ids=[running.id])
    assert_cancelled(running)
    wait_for(lambda: comfy.running is None)  # our interrupt reached it
    check.check_instance(instance.id)
    assert not AlbumItem.objects.filter(project=project).exists()
    assert job_of(running).status == Status.FAILED


# --- API and MCP ------------------------------------------------------------------------


def api_client(user) -> Client:
    _, raw = tokens.token_create(user=user, name="test")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def post(client, path, body, **headers):
    return client.post(path, data=json.dumps(body), content_type="application/json", **headers)


def pending_jobs(owner, project, n):
    jobs = make_drafts(project, n)
    Job.objects.filter(id__in=[job.id for job in jobs]).update(status=Status.PENDING)
    return jobs


def test_the_api_cancels_jobs_and_answers_counts(owner, project):
    first, second = pending_jobs(owner, project, 2)
    [draft] = make_drafts(project)
    api = api_client(owner)
    response = post(api, "/api/jobs/cancel", {"job_ids": [str(first.id), str(draft.id)]})
    assert response.status_code == 200 and response.json() == {"cancelled": 1, "skipped": 1}
    assert_cancelled(first)
    assert job_of(second).status == Status.PENDING


def test_the_api_replays_an_idempotent_cancel(owner, project):
    [job] = pending_jobs(owner, project, 1)
    api = api_client(owner)
    body = {"job_ids": [str(job.id)]}
    first = post(api, "/api/jobs/cancel", body, HTTP_IDEMPOTENCY_KEY="k1")
    again = post(api, "/api/jobs/cancel", body, HTTP_IDEMPOTENCY_KEY="k1")
    assert first.json() == again.json() == {"cancelled": 1, "skipped": 0}
    assert post(api, "/api/jobs/cancel", {"job_ids": [str(uuid.uuid4())]}, HTTP_IDEMPOTENCY_KEY="k1").status_code == 422


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({}, 400, "job_ids: Field required"),
        ({"job_ids": "abc"}, 400, "job_ids: Input should be a valid list"),
        ({"job_ids": ["not-a-uuid"]}, 400, "job_ids.0: Input should be a valid UUID"),
        ({"job_ids": [str(uuid.uuid4())]}, 404, "job not found"),
    ],
)
def test_the_api_refuses_bad_input_readably(owner, body, code, message):
    response = post(api_client(owner), "/api/jobs/cancel", body)
    assert response.status_code == code and message in response.json()["error"]


def test_another_users_job_answers_404_and_is_left_alone(owner, outsider, project):
    [job] = pending_jobs(owner, project, 1)
    response = post(api_client(outsider), "/api/jobs/cancel", {"job_ids": [str(job.id)]})
    assert response.status_code == 404 and job_of(job).status == Status.PENDING
    assert Client().post("/api/jobs/cancel", data="{}", content_type="application/json").status_code == 401


def mcp_call(user, name, arguments):
    _, raw = tokens.token_create(user=user, name="agent")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    return client.post("/mcp", data=json.dumps(message), content_type="application/json").json()["result"]


def test_the_mcp_tool_cancels_jobs_and_refuses_bad_ids_readably(owner, project):
    [job] = pending_jobs(owner, project, 1)
    result = mcp_call(owner, "cancel_jobs", {"job_ids": [str(job.id)]})
    assert result["isError"] is False and result["structuredContent"] == {"cancelled": 1, "skipped": 0}
    assert_cancelled(job)
    refused = mcp_call(owner, "cancel_jobs", {"job_ids": []})
    assert refused["isError"] is True and "job_ids" in refused["content"][0]["text"]


# --- the pages --------------------------------------------------------------------------


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def test_the_project_page_cancels_one_row_or_the_selected_jobs(signed_in, owner, project):
    first, second, third = pending_jobs(owner, project, 3)
    page = signed_in.get(f"/projects/{project.id}/").content.decode()
    assert page.count("data-cancel") == 3 and 'id="cancel-selected"' in page

    # one row's button: only that job, even with others ticked (the page sends the form)
    response = signed_in.post(
        f"/projects/{project.id}/cancel", {"only": str(first.id), "job": [str(second.id)]}, HTTP_X_REQUESTED_WITH="fetch"
    )
    assert response.json()["messages"] == [{"level": "success", "text": "1 job(s) cancelled"}]
    assert_cancelled(first)
    assert job_of(second).status == Status.PENDING

    response = signed_in.post(f"/projects/{project.id}/cancel", {"job": [str(first.id), str(second.id), str(third.id)]})
    assert response.status_code == 302
    assert_cancelled(second)
    assert_cancelled(third)
    page = signed_in.get(f"/projects/{project.id}/").content.decode()
    assert "data-cancel" not in page and 'data-state="cancelled"' in page


def test_the_job_page_has_a_cancel_button_while_the_job_is_pending(signed_in, owner, outsider, project, client):
    [job] = pending_jobs(owner, project, 1)
    assert 'id="cancel-job"' in signed_in.get(f"/jobs/{job.id}/").content.decode()
    response = signed_in.post(f"/jobs/{job.id}/cancel")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.id}/"
    assert_cancelled(job)
    assert 'id="cancel-job"' not in signed_in.get(f"/jobs/{job.id}/").content.decode()

    [other] = pending_jobs(owner, project, 1)
    client.force_login(outsider)
    assert client.post(f"/jobs/{other.id}/cancel").status_code == 404
    assert client.post(f"/projects/{project.id}/cancel", {"job": [str(other.id)]}).status_code == 404
    assert client.post("/queue/cancel", {"job": [str(other.id)]}).status_code == 302
    assert job_of(other).status == Status.PENDING


def test_the_monitor_cancels_a_row_and_shows_it_as_cancelled(signed_in, owner, project):
    heartbeats.beat("worker")
    [job] = pending_jobs(owner, project, 1)
    assert "data-cancel" in signed_in.get("/queue/").content.decode()
    response = signed_in.post("/queue/cancel", {"job": str(job.id), "next": "/queue/?state=cancelled"})
    assert response.status_code == 302 and response["Location"] == "/queue/?state=cancelled"
    assert_cancelled(job)
    page = signed_in.get("/queue/?state=cancelled").content.decode()
    assert f'data-job="{job.id}" data-state="cancelled"' in page and "Cancelled" in page


def test_the_monitor_cancels_the_selected_jobs(signed_in, owner, project):
    first, second, third = pending_jobs(owner, project, 3)
    page = signed_in.get("/queue/").content.decode()
    assert page.count('form="monitor-cancel-form"') == 3 and 'id="cancel-selected"' in page
    response = signed_in.post("/queue/cancel", {"job": [str(first.id), str(third.id)], "next": "/queue/"})
    assert response.status_code == 302
    assert_cancelled(first)
    assert_cancelled(third)
    assert job_of(second).status == Status.PENDING
    assert signed_in.get("/queue/").content.decode().count('form="monitor-cancel-form"') == 1


def test_a_detached_job_started_against_the_fake_provider_is_cancelled_there(owner, settings, inline_tasks):
    with FakeAsyncProvider(polls_before_done=50) as fake:
        settings.OUTBOUND_ALLOWLIST = [f"http://{fake.host}"]
        provider = make_provider(owner, name="RH fake", family="runninghub", concurrency=1)
        provider.api_key = "rh-test-key-123"
        provider.base_url = f"{fake.url}/openapi/v2"
        provider.save()
        project = make_project(owner, provider, model="workflow")
        params = {"workflow_id": "1987", "prompt_node": {"nodeId": "6", "fieldName": "text"}}
        first, second = make_drafts(project, 2, params=params)
        jobs_start(user=owner, project=project, all_drafts=True)
        inline_tasks.run(limit=1)
        task_id = job_of(first).task_id
        assert task_id and job_of(second).status == Status.PENDING  # the one slot is held by the detached task

        jobs_cancel(user=owner, job_ids=[first.id])
        assert_cancelled(first)
        assert fake.cancelled == [task_id]
        assert job_of(second).status == Status.PROCESSING  # the freed slot went to the next job at once


@responses.activate
def test_many_detached_tasks_are_cancelled_at_once_not_one_after_another(owner, monkeypatch):
    jobs = [detached(owner, "replicate", task_id=f"many{n}", model="black-forest-labs/flux-schnell") for n in range(8)]

    def slow_cancel(request):
        time.sleep(0.5)  # a slow provider: eight in a row would take 4 s
        return (200, {}, json.dumps(replicate_prediction("canceled")))

    for n in range(8):
        responses.add_callback(responses.POST, f"{REPLICATE}/many{n}/cancel", callback=slow_cancel)
    started = time.monotonic()
    assert jobs_cancel(user=owner, job_ids=[job.id for job in jobs]) == {"cancelled": 8, "skipped": 0}
    assert time.monotonic() - started < 2.5
    assert sorted(call.request.url for call in responses.calls) == sorted(f"{REPLICATE}/many{n}/cancel" for n in range(8))


@responses.activate
def test_a_finished_task_cancelled_before_its_collector_ran_is_not_collected(owner, inline_tasks):
    job = detached(owner, "replicate", task_id="done1", model="black-forest-labs/flux-schnell")
    finished = replicate_prediction("succeeded", prediction_id="done1", output=["https://replicate.delivery/done1.png"])
    responses.add(responses.GET, f"{REPLICATE}/done1", json=finished)
    responses.add(responses.POST, f"{REPLICATE}/done1/cancel", json=finished)
    assert poll_once(now=timezone.now()) == 1
    assert [func for func, _ in inline_tasks.queue] == ["queue_app.tasks.collect_job"]  # handed to a collector
    jobs_cancel(user=owner, job_ids=[job.id])
    inline_tasks.run()  # the collector arrives after the cancel
    assert_cancelled(job)
    assert not AlbumItem.objects.filter(job=job).exists()
    assert not [call for call in responses.calls if call.request.url.endswith(".png")]  # nothing downloaded
