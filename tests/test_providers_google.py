"""Gemini adapter against the recorded shapes (../shared/providers/google-gemini.md)."""

import json

import pytest
import responses

from queue_app.providers import google
from queue_app.providers.base import AmbiguousError, Failed, Finished, PermanentError, Running, Submitted, TransientError
from tests.fakes.dns import use_fake_dns
from tests.fakes.provider_shapes import PNG, PNG_B64, gemini_error, gemini_image, resolved

BASE = "https://generativelanguage.googleapis.com/v1beta"
IMAGE_URL = f"{BASE}/models/gemini-3-pro-image-preview:generateContent"
TEXT_URL = f"{BASE}/models/gemini-2.5-flash:generateContent"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


def image_job(**fields):
    fields.setdefault("model", "gemini-3-pro-image-preview")
    fields.setdefault("aspect_ratio", "16:9")
    fields.setdefault("resolution", "2K")
    return resolved("google", **fields)


@responses.activate
def test_it_returns_inline_images_skips_thoughts_and_puts_image_config_inside_generation_config():
    responses.add(responses.POST, IMAGE_URL, json=gemini_image())
    result = image_job()
    result = google.submit(result)
    assert isinstance(result, Finished)
    [output] = result.outputs
    assert output.data == PNG and output.content_type == "image/png"
    request = responses.calls[0].request
    sent = json.loads(request.body)
    assert sent["generationConfig"] == {
        "responseModalities": ["IMAGE"],
        "imageConfig": {"aspectRatio": "16:9", "imageSize": "2K"},
    }
    assert "imageConfig" not in sent and "thinkingConfig" not in sent
    assert request.headers["x-goog-api-key"] == "test-key" and "key=" not in request.url


@responses.activate
def test_every_image_part_is_kept_and_references_go_inline():
    two = gemini_image(
        {"text": "thinking", "thought": True, "thoughtSignature": "x"},
        {"inlineData": {"mimeType": "image/png", "data": PNG_B64}},
        {"text": "and another"},
        {"inlineData": {"mimeType": "image/jpeg", "data": PNG_B64}},
    )
    responses.add(responses.POST, IMAGE_URL, json=two)
    result = google.submit(image_job(references=[f"data:image/png;base64,{PNG_B64}"]))
    assert [o.content_type for o in result.outputs] == ["image/png", "image/jpeg"]
    parts = json.loads(responses.calls[0].request.body)["contents"][0]["parts"]
    assert parts[0] == {"text": "a red fox in snow"} and parts[1]["inlineData"]["data"] == PNG_B64


@responses.activate
def test_a_1k_only_model_gets_no_image_size():
    url = f"{BASE}/models/gemini-2.5-flash-image:generateContent"
    responses.add(responses.POST, url, json=gemini_image())
    google.submit(image_job(model="gemini-2.5-flash-image", resolution="1K"))
    assert "imageSize" not in json.loads(responses.calls[0].request.body)["generationConfig"]["imageConfig"]


@responses.activate
def test_a_blocked_prompt_arrives_as_http_200_and_is_permanent_with_a_readable_reason():
    responses.add(
        responses.POST,
        IMAGE_URL,
        json={"promptFeedback": {"blockReason": "PROHIBITED_CONTENT", "blockReasonMessage": "The prompt was blocked."}},
    )
    with pytest.raises(PermanentError) as caught:
        google.submit(image_job())
    assert caught.value.reason == "Gemini blocked the prompt (PROHIBITED_CONTENT): The prompt was blocked."


@pytest.mark.parametrize("finish", ["IMAGE_PROHIBITED_CONTENT", "SAFETY", "IMAGE_SAFETY", "RECITATION", "SPII"])
@responses.activate
def test_a_safety_finish_reason_without_parts_is_permanent(finish):
    responses.add(
        responses.POST,
        IMAGE_URL,
        json={
            "candidates": [
                {
                    "content": {"role": "model"},
                    "finishReason": finish,
                    "finishMessage": "The model output could not be generated.",
                }
            ]
        },
    )
    with pytest.raises(PermanentError, match=f"safety \\({finish}\\): The model output"):
        google.submit(image_job())


@responses.activate
def test_no_image_is_transient_and_a_text_only_answer_is_permanent_with_the_text():
    responses.add(responses.POST, IMAGE_URL, json={"candidates": [{"content": {"role": "model"}, "finishReason": "NO_IMAGE"}]})
    with pytest.raises(TransientError, match="NO_IMAGE"):
        google.submit(image_job())
    responses.replace(responses.POST, IMAGE_URL, json=gemini_image({"text": "I can't draw that."}))
    with pytest.raises(PermanentError, match="I can't draw that"):
        google.submit(image_job())


@responses.activate
def test_text_concatenates_parts_without_thoughts_and_keeps_thinking_config_out_of_the_top_level():
    responses.add(
        responses.POST,
        TEXT_URL,
        json=gemini_image({"text": "summary of thoughts", "thought": True}, {"text": "Hello, "}, {"text": "world."}),
    )
    job = resolved("google", kind="text", model="gemini-2.5-flash", system_prompt="Be kind.", max_tokens=64, temperature=0.2)
    result = google.submit(job)
    assert result.outputs[0].text == "Hello, world."
    sent = json.loads(responses.calls[0].request.body)
    assert sent["systemInstruction"] == {"parts": [{"text": "Be kind."}]}
    assert sent["generationConfig"] == {"maxOutputTokens": 64, "temperature": 0.2} and "thinkingConfig" not in sent


@responses.activate
def test_a_rate_limit_reads_retry_info_and_a_daily_quota_waits_for_the_reset():
    retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "42s"}
    responses.add(responses.POST, IMAGE_URL, json=gemini_error(429, "RESOURCE_EXHAUSTED", "quota", retry), status=429)
    with pytest.raises(TransientError) as caught:
        google.submit(image_job())
    assert caught.value.delay == 42
    daily = {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel"}],
    }
    responses.replace(responses.POST, IMAGE_URL, json=gemini_error(429, "RESOURCE_EXHAUSTED", "quota", daily, retry), status=429)
    with pytest.raises(TransientError) as caught:
        google.submit(image_job())
    assert 60 <= caught.value.delay <= 25 * 3600


@pytest.mark.parametrize(
    "status, body, error, words",
    [
        (
            400,
            gemini_error(
                400,
                "INVALID_ARGUMENT",
                "API key not valid.",
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"},
            ),
            PermanentError,
            "API key",
        ),
        (400, gemini_error(400, "INVALID_ARGUMENT", "imageSize '4k' is invalid"), PermanentError, "4k"),
        (400, gemini_error(400, "FAILED_PRECONDITION", "billing not enabled"), PermanentError, "billing"),
        (403, gemini_error(403, "PERMISSION_DENIED", "no access"), PermanentError, "no access"),
        (404, gemini_error(404, "NOT_FOUND", "model retired"), PermanentError, "retired"),
        (500, gemini_error(500, "INTERNAL", "oops"), TransientError, "INTERNAL"),
        (503, gemini_error(503, "UNAVAILABLE", "overloaded"), TransientError, "overloaded"),
        (504, gemini_error(504, "DEADLINE_EXCEEDED", "deadline"), AmbiguousError, "may have been accepted"),
    ],
)
@responses.activate
def test_http_errors_map_to_their_class(status, body, error, words):
    responses.add(responses.POST, IMAGE_URL, json=body, status=status)
    with pytest.raises(error, match=words):
        google.submit(image_job())


@responses.activate
def test_malformed_json_is_ambiguous_and_bad_base64_too():
    responses.add(responses.POST, IMAGE_URL, body="<html>", status=200)
    with pytest.raises(AmbiguousError):
        google.submit(image_job())
    responses.replace(responses.POST, IMAGE_URL, json=gemini_image({"inlineData": {"mimeType": "image/png", "data": "%%%"}}))
    with pytest.raises(AmbiguousError, match="base64"):
        google.submit(image_job())


@responses.activate
def test_veo_runs_as_an_operation_through_the_detached_path():
    create = f"{BASE}/models/veo-3.1-generate-preview:predictLongRunning"
    name = "models/veo-3.1-generate-preview/operations/abc123"
    responses.add(responses.POST, create, json={"name": name})
    job = resolved("google", kind="video", model="veo-3.1-generate-preview", aspect_ratio="9:16", duration=8, resolution="720p")
    assert google.submit(job) == Submitted(task_id=name)
    sent = json.loads(responses.calls[0].request.body)
    assert sent["parameters"] == {"aspectRatio": "9:16", "durationSeconds": 8, "resolution": "720p"}
    responses.add(responses.GET, f"{BASE}/{name}", json={"name": name, "done": False})
    assert google.check(name, job) == Running()
    video_uri = f"{BASE}/files/xyz:download?alt=media"
    done = {
        "name": name,
        "done": True,
        "response": {"generateVideoResponse": {"generatedSamples": [{"video": {"uri": video_uri}}]}},
    }
    responses.replace(responses.GET, f"{BASE}/{name}", json=done)
    [output] = google.check(name, job).outputs
    assert output.kind == "video" and output.url == video_uri and output.headers == {"x-goog-api-key": "test-key"}


@responses.activate
def test_a_failed_filtered_or_vanished_operation_is_a_failed_task():
    job = resolved("google", kind="video", model="veo-3.1-generate-preview")
    op = "models/veo/operations/"
    responses.add(responses.GET, f"{BASE}/{op}1", json={"done": True, "error": {"code": 3, "message": "bad prompt"}})
    assert google.check(f"{op}1", job) == Failed(reason="Gemini video failed: bad prompt", permanent=True)
    responses.add(responses.GET, f"{BASE}/{op}2", json={"done": True, "error": {"code": 13, "message": "internal"}})
    assert google.check(f"{op}2", job).permanent is False
    filtered = {"done": True, "response": {"generateVideoResponse": {"raiMediaFilteredReasons": ["celebrity"]}}}
    responses.add(responses.GET, f"{BASE}/{op}3", json=filtered)
    assert "safety" in google.check(f"{op}3", job).reason
    responses.add(responses.GET, f"{BASE}/{op}4", json=gemini_error(404, "NOT_FOUND", "gone"), status=404)
    assert "404" in google.check(f"{op}4", job).reason
    assert isinstance(google.check("../../etc/passwd", job), Failed)
