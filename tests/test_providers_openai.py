"""OpenAI adapter against the recorded shapes (../shared/providers/openai.md)."""

import json

import pytest
import requests
import responses

from queue_app.providers import openai
from queue_app.providers.base import AmbiguousError, Failed, Finished, PermanentError, Running, Submitted, TransientError
from tests.fakes.dns import use_fake_dns
from tests.fakes.provider_shapes import PNG, PNG_B64, openai_error, openai_images, resolved

GEN = "https://api.openai.com/v1/images/generations"
EDIT = "https://api.openai.com/v1/images/edits"
CHAT = "https://api.openai.com/v1/chat/completions"
VIDEOS = "https://api.openai.com/v1/videos"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


def image_job(**fields):
    fields.setdefault("model", "gpt-image-1.5")
    fields.setdefault("aspect_ratio", "1536x1024")
    return resolved("openai", **fields)


@responses.activate
def test_it_returns_b64_json_images_and_sends_the_snapshot():
    responses.add(responses.POST, GEN, json=openai_images())
    result = openai.submit(image_job(quality="high", background="transparent", format="png"))
    assert isinstance(result, Finished)
    [output] = result.outputs
    assert output.data == PNG and output.content_type == "image/png" and output.kind == "image"
    sent = json.loads(responses.calls[0].request.body)
    assert sent == {
        "model": "gpt-image-1.5",
        "prompt": "a red fox in snow",
        "size": "1536x1024",
        "n": 1,
        "quality": "high",
        "background": "transparent",
        "output_format": "png",
    }
    assert responses.calls[0].request.headers["Authorization"] == "Bearer test-key"


@responses.activate
def test_it_returns_url_outputs_of_dalle_and_several_images():
    responses.add(responses.POST, GEN, json=openai_images({"url": "https://oaidalle.example/a.png"}, {"b64_json": PNG_B64}))
    result = openai.submit(image_job(model="dall-e-2", aspect_ratio="16:9", params={"n": 2}))
    assert [o.url for o in result.outputs] == ["https://oaidalle.example/a.png", None]
    assert result.outputs[1].data == PNG
    sent = json.loads(responses.calls[0].request.body)
    assert sent["response_format"] == "b64_json" and sent["n"] == 2 and "background" not in sent


@responses.activate
def test_references_go_to_edits_as_multipart_files():
    responses.add(responses.POST, EDIT, json=openai_images())
    refs = [f"data:image/png;base64,{PNG_B64}", f"data:image/png;base64,{PNG_B64}"]
    result = openai.submit(image_job(references=refs))
    assert isinstance(result, Finished)
    request = responses.calls[0].request
    assert request.headers["Content-Type"].startswith("multipart/form-data")
    assert request.body.count(b'name="image[]"') == 2 and PNG in request.body


@responses.activate
def test_text_comes_from_chat_completions():
    responses.add(
        responses.POST, CHAT, json={"choices": [{"message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}]}
    )
    result = openai.submit(resolved("openai", kind="text", model="gpt-4o", system_prompt="Be brief.", max_tokens=50))
    assert result.outputs[0].text == "Hello." and result.outputs[0].kind == "text"
    sent = json.loads(responses.calls[0].request.body)
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."} and sent["max_completion_tokens"] == 50


@responses.activate
def test_a_content_filtered_answer_is_permanent():
    responses.add(responses.POST, CHAT, json={"choices": [{"message": {"content": None}, "finish_reason": "content_filter"}]})
    with pytest.raises(PermanentError, match="content filter"):
        openai.submit(resolved("openai", kind="text", model="gpt-4o"))


@pytest.mark.parametrize(
    "status, body, error, words",
    [
        (400, openai_error("Invalid size '999x1'", param="size"), PermanentError, "Invalid size"),
        (401, openai_error("Incorrect API key provided", code="invalid_api_key"), PermanentError, "credentials"),
        (403, openai_error("Country, region, or territory not supported"), PermanentError, "region"),
        (404, openai_error("The model does not exist"), PermanentError, "does not exist"),
        (422, openai_error("Unprocessable"), PermanentError, "Unprocessable"),
        (409, openai_error("conflict"), TransientError, "409"),
        (500, openai_error("server_error", type_="server_error"), TransientError, "500"),
        (503, openai_error("overloaded", code="server_is_overloaded"), TransientError, "overloaded"),
        (502, "<html>bad gateway</html>", AmbiguousError, "may have been accepted"),
    ],
)
@responses.activate
def test_http_errors_map_to_their_class(status, body, error, words):
    if isinstance(body, dict):
        responses.add(responses.POST, GEN, json=body, status=status)
    else:
        responses.add(responses.POST, GEN, body=body, status=status)
    with pytest.raises(error, match=words):
        openai.submit(image_job())


@responses.activate
def test_a_rate_limit_carries_the_servers_delay():
    responses.add(
        responses.POST,
        GEN,
        json=openai_error("Rate limit reached for images per minute", type_="requests", code="rate_limit_exceeded"),
        status=429,
        headers={"retry-after-ms": "1500", "retry-after": "2", "x-ratelimit-remaining-requests": "0"},
    )
    with pytest.raises(TransientError) as caught:
        openai.submit(image_job())
    assert caught.value.delay == 1.5
    responses.replace(responses.POST, GEN, json=openai_error("slow down"), status=429, headers={"retry-after": "7"})
    with pytest.raises(TransientError) as caught:
        openai.submit(image_job())
    assert caught.value.delay == 7


@responses.activate
def test_insufficient_quota_is_not_a_transient_429():
    responses.add(
        responses.POST,
        GEN,
        json=openai_error("You exceeded your current quota", type_="insufficient_quota", code="insufficient_quota"),
        status=429,
        headers={"retry-after": "1"},
    )
    with pytest.raises(PermanentError, match="billing"):
        openai.submit(image_job())


@pytest.mark.parametrize(
    "body",
    [
        openai_error(
            "Your request was rejected as a result of our safety system.",
            code="content_policy_violation",
        ),
        openai_error(
            "Your request was rejected by the safety system. safety_violations=[sexual]",
            type_="image_generation_user_error",
            code="moderation_blocked",
        ),
    ],
)
@responses.activate
def test_moderation_blocks_are_permanent_with_the_reason(body):
    responses.add(responses.POST, GEN, json=body, status=400)
    with pytest.raises(PermanentError, match="content policy") as caught:
        openai.submit(image_job())
    assert "rejected" in caught.value.reason


@responses.activate
def test_malformed_json_on_a_create_call_is_ambiguous():
    responses.add(responses.POST, GEN, body="{not json", status=200)
    with pytest.raises(AmbiguousError):
        openai.submit(image_job())


@responses.activate
def test_invalid_base64_is_ambiguous_and_empty_data_is_permanent():
    responses.add(responses.POST, GEN, json=openai_images({"b64_json": "***"}))
    with pytest.raises(AmbiguousError, match="base64"):
        openai.submit(image_job())
    responses.replace(responses.POST, GEN, json={"created": 1, "data": []})
    with pytest.raises(PermanentError, match="no image"):
        openai.submit(image_job())


@responses.activate
def test_a_huge_response_is_capped(settings):
    settings.OUTBOUND_MAX_BYTES = 10_000
    responses.add(responses.POST, GEN, json=openai_images({"b64_json": "A" * 50_000}))
    with pytest.raises(PermanentError, match="cap"):
        openai.submit(image_job())


@responses.activate
def test_timeouts_before_and_after_sending_are_told_apart():
    responses.add(responses.POST, GEN, body=requests.ConnectTimeout("connect timed out"))
    with pytest.raises(TransientError, match="could not connect"):
        openai.submit(image_job())
    responses.replace(responses.POST, GEN, body=requests.ReadTimeout("read timed out"))
    with pytest.raises(AmbiguousError, match="may have been accepted"):
        openai.submit(image_job())
    assert len(responses.calls) == 2  # each sent once: no retry layer


def test_a_private_base_url_is_refused_before_any_request(settings):
    settings.OUTBOUND_ALLOWLIST = []
    with pytest.raises(PermanentError, match="refused"):
        openai.submit(image_job(base_url="https://169.254.169.254/v1"))


@responses.activate
def test_sora_video_is_submitted_then_polled_to_a_file_with_a_poster():
    responses.add(responses.POST, VIDEOS, json={"id": "video_123", "object": "video", "status": "queued", "progress": 0})
    job = resolved("openai", kind="video", model="sora-2", aspect_ratio="16:9", duration=8)
    assert openai.submit(job) == Submitted(task_id="video_123")
    sent = json.loads(responses.calls[0].request.body)
    assert sent == {"model": "sora-2", "prompt": "a red fox in snow", "size": "1280x720", "seconds": "8"}
    responses.add(responses.GET, f"{VIDEOS}/video_123", json={"id": "video_123", "status": "in_progress", "progress": 40})
    assert openai.check("video_123", job) == Running(progress=0.4)
    responses.replace(responses.GET, f"{VIDEOS}/video_123", json={"id": "video_123", "status": "completed", "progress": 100})
    [output] = openai.check("video_123", job).outputs
    assert output.kind == "video" and output.url == f"{VIDEOS}/video_123/content"
    assert output.poster_url.endswith("/content?variant=thumbnail") and output.headers["Authorization"] == "Bearer test-key"


@responses.activate
def test_a_failed_or_vanished_video_is_a_failed_task():
    job = resolved("openai", kind="video", model="sora-2")
    responses.add(
        responses.GET,
        f"{VIDEOS}/video_1",
        json={"id": "video_1", "status": "failed", "error": {"code": "moderation_blocked", "message": "blocked"}},
    )
    assert openai.check("video_1", job) == Failed(reason="OpenAI video failed: blocked")
    responses.add(responses.GET, f"{VIDEOS}/video_2", json=openai_error("not found"), status=404)
    state = openai.check("video_2", job)
    assert isinstance(state, Failed) and "404" in state.reason
    responses.add(responses.GET, f"{VIDEOS}/video_3", status=503)
    with pytest.raises(TransientError):
        openai.check("video_3", job)
