"""Civitai adapter against the recorded shapes (../shared/providers/civitai.md)."""

import json

import pytest
import requests
import responses

from queue_app.providers import civitai, poll_seconds
from queue_app.providers.base import (
    AccountError,
    AmbiguousError,
    Failed,
    Finished,
    PermanentError,
    Running,
    Submitted,
    TransientError,
)
from tests.fakes.dns import use_fake_dns
from tests.fakes.provider_shapes import civitai_workflow, resolved

BASE = "https://orchestration.civitai.com"
SUBMIT = f"{BASE}/v2/consumer/workflows"
SDXL = "urn:air:sdxl:checkpoint:civitai:101055@128078"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


def job(**fields):
    fields.setdefault("model", SDXL)
    fields.setdefault("aspect_ratio", "16:9")
    return resolved("civitai", **fields)


def test_civitai_keeps_its_5_second_cadence_and_the_others_follow_the_setting(settings):
    # the poller applying it: test_polling.py::test_civitai_jobs_are_polled_every_5_seconds_by_the_queue_services_poll_step
    settings.DETACHED_POLL_SECONDS = 45
    assert [poll_seconds(f) for f in ("civitai", "openai", "google", "runninghub", "replicate")] == [5, 45, 45, 45, 45]


@responses.activate
def test_a_submit_sends_one_image_gen_step_with_a_unique_tag_and_returns_the_workflow_id():
    responses.add(responses.POST, SUBMIT, json=civitai_workflow("unassigned"), status=202)
    assert civitai.submit(job(params={"negativePrompt": "blurry", "quantity": 2})) == Submitted(task_id="wf_01HXYZ")
    request = responses.calls[0].request
    assert request.url == f"{SUBMIT}?wait=0"
    sent = json.loads(request.body)
    assert sent["tags"] == ["rs-job-00000000-0000-0000-0000-000000000042"] and sent["allowMatureContent"] is False
    step = sent["steps"][0]
    assert step["$type"] == "imageGen"
    assert step["input"] == {
        "engine": "sdcpp",
        "ecosystem": "sdxl",
        "operation": "createImage",
        "model": SDXL,
        "prompt": "a red fox in snow",
        "width": 1344,
        "height": 768,
        "negativePrompt": "blurry",
        "quantity": 2,
    }


@responses.activate
def test_a_workflow_finished_within_the_wait_returns_its_images():
    urls = [f"https://orchestration.civitai.com/v2/consumer/blobs/{n}.jpg?sig=x" for n in range(2)]
    responses.add(responses.POST, SUBMIT, json=civitai_workflow("succeeded", images=urls))
    result = civitai.submit(job())
    assert isinstance(result, Finished) and [o.url for o in result.outputs] == urls
    assert result.outputs[0].content_type == "image/jpeg"


@responses.activate
def test_check_reads_statuses_and_tolerates_unknown_ones():
    url = f"{SUBMIT}/wf_01HXYZ"
    for status in ("unassigned", "preparing", "scheduled", "processing", "pending", "something-new"):
        responses.upsert(responses.GET, url, json=civitai_workflow(status))
        assert civitai.check("wf_01HXYZ", job()) == Running()
    responses.upsert(responses.GET, url, json=civitai_workflow("succeeded", images=["https://b.example/x.png"]))
    assert civitai.check("wf_01HXYZ", job()).outputs[0].url == "https://b.example/x.png"


@pytest.mark.parametrize(
    "status, reason, permanent, words",
    [
        ("failed", "blocked", True, "moderation"),
        ("failed", "no_provider_available", False, "no_provider_available"),
        ("failed", "timeout", False, "timeout"),
        ("failed", None, False, "failed"),
        ("expired", None, False, "expired"),
        ("canceled", None, True, "canceled"),
    ],
)
@responses.activate
def test_failed_workflows_are_classified_by_their_reason(status, reason, permanent, words):
    responses.add(responses.GET, f"{SUBMIT}/wf_1", json=civitai_workflow(status, reason=reason))
    state = civitai.check("wf_1", job())
    assert isinstance(state, Failed) and state.permanent is permanent and words in state.reason


@responses.activate
def test_succeeded_with_nothing_available_yet_keeps_polling_and_with_nothing_at_all_fails():
    pending = civitai_workflow("succeeded", images=["https://b.example/x.png"])
    pending["steps"][0]["output"]["images"][0]["available"] = False
    responses.add(responses.GET, f"{SUBMIT}/wf_1", json=pending)
    assert civitai.check("wf_1", job()) == Running()
    responses.add(responses.GET, f"{SUBMIT}/wf_2", json=civitai_workflow("succeeded", images=[]))
    assert isinstance(civitai.check("wf_2", job()), Failed)
    responses.add(responses.GET, f"{SUBMIT}/wf_3", status=404)
    assert "404" in civitai.check("wf_3", job()).reason


@pytest.mark.parametrize(
    "status, body, headers, error",
    [
        (
            400,
            {"title": "One or more validation errors occurred.", "status": 400, "errors": {"width": ["bad"]}},
            {},
            PermanentError,
        ),
        (401, {"title": "Unauthorized", "status": 401}, {}, AccountError),
        (403, {"title": "Forbidden", "status": 403}, {}, PermanentError),
        (402, {"title": "Payment required", "detail": "Insufficient Buzz"}, {}, AccountError),
        (429, {"title": "Too many requests"}, {"Retry-After": "9"}, TransientError),
        (500, {"title": "boom"}, {}, TransientError),
    ],
)
@responses.activate
def test_problem_details_errors_map_to_their_class(status, body, headers, error):
    responses.add(responses.POST, SUBMIT, json=body, status=status, headers=headers)
    with pytest.raises(error) as caught:
        civitai.submit(job())
    assert type(caught.value) is error  # the exact class: an account problem pauses, a permanent one fails
    if status == 429:
        assert caught.value.delay == 9
    if status == 400:
        assert "width: bad" in caught.value.reason


@responses.activate
def test_an_ambiguous_submit_is_found_by_its_tag_instead_of_paid_again():
    responses.add(responses.POST, SUBMIT, body=requests.ReadTimeout("read timed out"))
    query = f"{SUBMIT}?tags=rs-job-00000000-0000-0000-0000-000000000042&take=5&hideMatureContent=false"
    responses.add(responses.GET, query, json={"next": None, "items": [civitai_workflow("processing", workflow_id="wf_found")]})
    assert civitai.submit(job()) == Submitted(task_id="wf_found")
    assert sum(1 for call in responses.calls if call.request.method == "POST") == 1


@responses.activate
def test_an_ambiguous_submit_that_is_not_found_stays_ambiguous():
    responses.add(responses.POST, SUBMIT, body=requests.ConnectionError("reset"))
    responses.add(responses.GET, f"{SUBMIT}?tags=rs-job-00000000-0000-0000-0000-000000000042", json={"items": []})
    with pytest.raises(AmbiguousError):
        civitai.submit(job())
    responses.replace(responses.POST, SUBMIT, body="garbage", status=200)
    with pytest.raises(AmbiguousError):
        civitai.submit(job())


@responses.activate
def test_a_submit_carries_its_attempts_tag_and_find_submitted_looks_that_tag_up():
    responses.add(responses.POST, SUBMIT, json=civitai_workflow("unassigned"), status=202)
    attempt = job(tag="rs-00000000-0000-0000-0000-000000000042-3")
    civitai.submit(attempt)
    assert json.loads(responses.calls[0].request.body)["tags"] == [
        "rs-job-00000000-0000-0000-0000-000000000042",
        "rs-00000000-0000-0000-0000-000000000042-3",
    ]
    earlier = "rs-00000000-0000-0000-0000-000000000042-2"
    found = dict(civitai_workflow("processing", workflow_id="wf_found"), tags=[earlier])
    responses.add(responses.GET, f"{SUBMIT}?tags={earlier}&take=5&hideMatureContent=false", json={"items": [found]})
    assert civitai.find_submitted(attempt, earlier) == ["wf_found"]


@responses.activate
def test_find_submitted_raises_when_the_lookup_fails_rather_than_finding_nothing():
    responses.add(responses.GET, SUBMIT, status=500, json={"title": "oops", "status": 500})
    with pytest.raises(TransientError):
        civitai.find_submitted(job(), "rs-x-1")


@responses.activate
def test_cancel_puts_the_workflow_to_canceled_and_a_404_is_fine():
    responses.add(responses.PUT, f"{SUBMIT}/wf_01HXYZ", json=civitai_workflow("canceled"))
    responses.add(responses.PUT, f"{SUBMIT}/wf_gone", status=404, json={"title": "Not Found", "status": 404})
    civitai.cancel("wf_01HXYZ", job())
    civitai.cancel("wf_gone", job())
    assert json.loads(responses.calls[0].request.body) == {"status": "canceled"}
