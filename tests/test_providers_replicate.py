"""Replicate adapter against the recorded shapes (../shared/providers/replicate.md)."""

import json

import pytest
import requests
import responses

from queue_app.providers import replicate
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
from tests.fakes.provider_shapes import replicate_prediction, resolved

BASE = "https://api.replicate.com/v1"
CREATE = f"{BASE}/predictions"
PID = "vgcm4plb7tgzlyznry5d5jkgvu"
GET = f"{BASE}/predictions/{PID}"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


def job(**fields):
    fields.setdefault("model", "black-forest-labs/flux-2-pro")
    fields.setdefault("aspect_ratio", "16:9")
    return resolved("replicate", **fields)


@responses.activate
def test_a_create_answers_201_with_the_prediction_id():
    responses.add(responses.POST, CREATE, json=replicate_prediction(), status=201, headers={"ratelimit-remaining": "599"})
    refs = ["https://cdn.example.com/a.png"]
    assert replicate.submit(job(resolution="1 MP", references=refs, params={"seed": 3})) == Submitted(task_id=PID)
    sent = json.loads(responses.calls[0].request.body)
    assert sent == {
        "version": "black-forest-labs/flux-2-pro",
        "input": {"prompt": "a red fox in snow", "aspect_ratio": "16:9", "resolution": "1 MP", "input_images": refs, "seed": 3},
    }
    assert "Prefer" not in responses.calls[0].request.headers


@responses.activate
def test_outputs_as_a_string_an_array_or_an_object():
    responses.add(
        responses.GET, GET, json=replicate_prediction("succeeded", output="https://replicate.delivery/xezq/abc/out.webp")
    )
    [one] = replicate.check(PID, job()).outputs
    assert one.url.endswith("out.webp") and one.content_type == "image/webp" and one.headers["Authorization"] == "Bearer test-key"
    many = [f"https://replicate.delivery/xezq/abc/out-{n}.png" for n in range(3)]
    responses.replace(responses.GET, GET, json=replicate_prediction("succeeded", output=many))
    assert [o.url for o in replicate.check(PID, job()).outputs] == many
    responses.replace(
        responses.GET, GET, json=replicate_prediction("succeeded", output={"file": "https://cdn.example.com/v.mp4"})
    )
    [video] = replicate.check(PID, job(kind="video", model="bytedance/seedance-1-pro")).outputs
    assert video.kind == "video" and video.headers == {}  # the token only goes to Replicate's own hosts


@responses.activate
def test_a_language_models_tokens_are_joined():
    responses.add(responses.GET, GET, json=replicate_prediction("succeeded", output=["Hel", "lo", "."]))
    assert replicate.check(PID, job(kind="text", model="meta/llama")).outputs[0].text == "Hello."


@responses.activate
def test_running_statuses_and_terminal_failures():
    for status in ("starting", "processing"):
        responses.upsert(responses.GET, GET, json=replicate_prediction(status))
        assert replicate.check(PID, job()) == Running()
    for status in ("canceled", "aborted"):
        responses.upsert(responses.GET, GET, json=replicate_prediction(status))
        state = replicate.check(PID, job())
        assert isinstance(state, Failed) and state.permanent and status in state.reason


@pytest.mark.parametrize(
    "error, permanent",
    [
        ("NSFW content detected. Try running it again, or try a different prompt.", True),
        ("The input or output was flagged as sensitive. Please try again with different inputs. (E005)", True),
        ("Input validation error: could not fetch image", True),
        ("CUDA out of memory", False),
    ],
)
@responses.activate
def test_a_failed_prediction_is_classified_by_its_error_text(error, permanent):
    responses.add(responses.GET, GET, json=replicate_prediction("failed", error=error))
    state = replicate.check(PID, job())
    assert isinstance(state, Failed) and state.permanent is permanent and error[:20] in state.reason


@responses.activate
def test_empty_output_and_removed_data_are_failures():
    responses.add(responses.GET, GET, json=replicate_prediction("succeeded", output=[]))
    assert "without any output" in replicate.check(PID, job()).reason
    responses.replace(responses.GET, GET, json=replicate_prediction("succeeded", output=None, data_removed=True))
    assert "deleted" in replicate.check(PID, job()).reason
    responses.replace(responses.GET, GET, status=404, json={"detail": "Not found."})
    assert "404" in replicate.check(PID, job()).reason


@responses.activate
def test_a_create_finished_in_sync_mode_returns_outputs():
    responses.add(
        responses.POST, CREATE, json=replicate_prediction("succeeded", output="https://replicate.delivery/a.png"), status=201
    )
    result = replicate.submit(job(options={"wait_seconds": 30}))
    assert isinstance(result, Finished)
    assert responses.calls[0].request.headers["Prefer"] == "wait=30"


@pytest.mark.parametrize(
    "status, body, headers, error, delay",
    [
        (422, {"title": "Invalid version or not permitted", "detail": "does not exist", "status": 422}, {}, PermanentError, None),
        (422, {"title": "Input validation failed", "detail": "- input: prompt is required\n"}, {}, PermanentError, None),
        (401, {"title": "Unauthenticated", "detail": "no token"}, {}, AccountError, None),
        (402, {"title": "Payment required", "detail": "add credit"}, {}, AccountError, None),
        (429, {"detail": "Request was throttled. Your rate limit resets in ~30s."}, {}, TransientError, 30),
        (429, {"detail": "throttled"}, {"Retry-After": "4"}, TransientError, 4),
        (503, {"detail": "unavailable"}, {}, TransientError, None),
        (504, {"detail": "gateway"}, {}, AmbiguousError, None),
    ],
)
@responses.activate
def test_http_errors_map_to_their_class(status, body, headers, error, delay):
    responses.add(responses.POST, CREATE, json=body, status=status, headers=headers)
    with pytest.raises(error) as caught:
        replicate.submit(job())
    assert type(caught.value) is error  # the exact class: an account problem pauses, a permanent one fails
    if delay is not None:
        assert caught.value.delay == delay


@responses.activate
def test_malformed_json_and_timeouts():
    responses.add(responses.POST, CREATE, body="<html>", status=201)
    with pytest.raises(AmbiguousError):
        replicate.submit(job())
    responses.replace(responses.POST, CREATE, body=requests.ReadTimeout())
    with pytest.raises(AmbiguousError):
        replicate.submit(job())
    responses.add(responses.GET, GET, body="{", status=200)
    with pytest.raises(TransientError):
        replicate.check(PID, job())
    assert sum(1 for call in responses.calls if call.request.method == "POST") == 2  # never re-sent


@responses.activate
def test_find_submitted_matches_model_and_input_from_the_list_and_stops_at_older_predictions():
    from datetime import UTC, datetime

    wanted = {"prompt": "a red fox in snow", "aspect_ratio": "16:9"}
    model = dict(model="black-forest-labs/flux-2-pro")
    page_one = [
        replicate_prediction(prediction_id="other-prompt", input={"prompt": "a corgi"}, **model),
        replicate_prediction(prediction_id="ours", input=dict(wanted, input_images=["https://x/re-signed.png"]), **model),
        replicate_prediction(prediction_id="other-model", input=wanted, model="someone/else"),
    ]
    older = replicate_prediction(prediction_id="too-old", input=wanted, created_at="2025-12-31T23:00:00.000Z", **model)
    responses.add(responses.GET, CREATE, json={"next": f"{CREATE}?cursor=p2", "results": page_one})
    responses.add(responses.GET, f"{CREATE}?cursor=p2", json={"next": f"{CREATE}?cursor=p3", "results": [older]})
    since = datetime(2026, 1, 1, tzinfo=UTC)
    assert replicate.find_submitted(job(references=["data:image/png;base64,AAAA"]), "rs-tag", since) == ["ours"]
    assert len(responses.calls) == 2  # an older prediction ends the walk: page 3 is never read


@responses.activate
def test_find_submitted_raises_when_the_list_cannot_be_read():
    responses.add(responses.GET, CREATE, status=503, json={"title": "Service Unavailable", "status": 503})
    with pytest.raises(TransientError):
        replicate.find_submitted(job(), "rs-tag", None)
