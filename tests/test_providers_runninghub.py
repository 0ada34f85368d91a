"""RunningHub adapter against the recorded shapes (../shared/providers/runninghub.md)."""

import json

import pytest
import responses

from queue_app.providers import runninghub
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
from tests.fakes.provider_shapes import resolved, rh_result, rh_task

BASE = "https://www.runninghub.ai/openapi/v2"
T2I = f"{BASE}/rhart-image-n-pro/text-to-image"
QUERY = f"{BASE}/query"
TASK = "2047154150516862978"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


def job(**fields):
    fields.setdefault("model", "rhart-image-n-pro/text-to-image")
    fields.setdefault("aspect_ratio", "16:9")
    fields.setdefault("resolution", "2k")
    return resolved("runninghub", **fields)


@responses.activate
def test_a_submit_returns_the_task_id_as_a_string():
    responses.add(responses.POST, T2I, json=rh_task())
    assert runninghub.submit(job()) == Submitted(task_id=TASK)
    request = responses.calls[0].request
    assert json.loads(request.body) == {"prompt": "a red fox in snow", "aspectRatio": "16:9", "resolution": "2k"}
    assert request.headers["Authorization"] == "Bearer test-key"


@responses.activate
def test_references_switch_to_the_edit_endpoint_and_workflows_get_their_node_list():
    responses.add(responses.POST, f"{BASE}/rhart-image-n-pro/edit", json=rh_task())
    runninghub.submit(job(references=["https://cdn.example.com/a.png"]))
    assert json.loads(responses.calls[0].request.body)["imageUrls"] == ["https://cdn.example.com/a.png"]
    responses.add(responses.POST, f"{BASE}/run/workflow/1987", json=rh_task())
    workflow = job(
        model="workflow",
        params={
            "workflow_id": "1987",
            "prompt_node": {"nodeId": "6", "fieldName": "text"},
            "node_info_list": [{"nodeId": "3", "fieldName": "seed", "fieldValue": 7}],
        },
    )
    assert runninghub.submit(workflow) == Submitted(task_id=TASK)
    sent = json.loads(responses.calls[1].request.body)
    assert sent["nodeInfoList"] == [
        {"nodeId": "3", "fieldName": "seed", "fieldValue": 7},
        {"nodeId": "6", "fieldName": "text", "fieldValue": "a red fox in snow"},
    ]


@responses.activate
def test_a_submit_that_already_succeeded_returns_the_outputs():
    responses.add(
        responses.POST, T2I, json=rh_task(status="SUCCESS", results=[rh_result("https://rh-images.example.com/a.jpg", "jpg")])
    )
    result = runninghub.submit(job())
    assert isinstance(result, Finished) and result.outputs[0].url.endswith("a.jpg")
    assert result.outputs[0].content_type == "image/jpeg"


@pytest.mark.parametrize(
    "code, message, error, words",
    [
        ("812", "CORPAPIKEY_INSUFFICIENT_FUNDS", PermanentError, "top up"),
        ("416", "TASK_CREATE_FAILED_BY_NOT_ENOUGH_WALLET", PermanentError, "top up"),
        ("301", "PARAMS_INVALID", PermanentError, "301"),
        ("802", "APIKEY_UNAUTHORIZED", PermanentError, "802"),
        ("1501", "content review failed", PermanentError, "moderation"),
        ("1505", "photorealistic real person prohibited", PermanentError, "moderation"),
        ("421", "TASK_QUEUE_MAXED", TransientError, "421"),
        ("1520", "concurrency limit", TransientError, "1520"),
        ("1000", "unknown error", TransientError, "1000"),
        ("1011", "NSFW violation detected", PermanentError, "moderation"),  # the words win over the code
        ("9999", "something new", PermanentError, "9999"),  # unknown on submit: do not loop paying
    ],
)
@responses.activate
def test_errors_arrive_as_http_200_and_follow_the_code_table(code, message, error, words):
    responses.add(responses.POST, T2I, json=rh_task(task_id="", status="", code=code, message=message))
    with pytest.raises(error, match=words):
        runninghub.submit(job())


@responses.activate
def test_the_v1_envelope_is_read_too():
    responses.add(responses.POST, T2I, json={"code": 380, "msg": "WORKFLOW_NOT_EXISTS", "data": None})
    with pytest.raises(PermanentError, match="WORKFLOW_NOT_EXISTS"):
        runninghub.submit(job())
    responses.replace(
        responses.POST,
        T2I,
        json={"code": 0, "msg": "success", "data": {"taskId": 1904, "taskStatus": "QUEUED", "promptTips": ""}},
    )
    assert runninghub.submit(job()) == Submitted(task_id="1904")


@responses.activate
def test_http_errors_malformed_json_and_a_missing_task_id():
    responses.add(responses.POST, T2I, status=429, headers={"Retry-After": "12"})
    with pytest.raises(TransientError) as caught:
        runninghub.submit(job())
    assert caught.value.delay == 12
    responses.replace(responses.POST, T2I, status=401, json={"code": 802, "msg": "APIKEY_UNAUTHORIZED"})
    with pytest.raises(AccountError, match="802"):
        runninghub.submit(job())
    responses.replace(responses.POST, T2I, body="not json", status=200)
    with pytest.raises(AmbiguousError):
        runninghub.submit(job())
    responses.replace(responses.POST, T2I, json=rh_task(task_id=""))
    with pytest.raises(AmbiguousError, match="task id"):
        runninghub.submit(job())


@responses.activate
def test_check_follows_the_status_values():
    responses.add(responses.POST, QUERY, json=rh_task(status="QUEUED"))
    assert runninghub.check(TASK, job()) == Running()
    assert json.loads(responses.calls[0].request.body) == {"taskId": TASK}
    responses.replace(responses.POST, QUERY, json={"code": 804, "msg": "APIKEY_TASK_IS_RUNNING", "data": {}})
    assert runninghub.check(TASK, job()) == Running()


@responses.activate
def test_several_results_become_several_outputs_and_a_layered_workflow_gets_roles():
    results = [rh_result(f"https://rh-images.example.com/{n}.png", node=str(n)) for n in range(5)]
    responses.add(responses.POST, QUERY, json=rh_task(status="SUCCESS", results=results))
    plain = runninghub.check(TASK, job())
    assert [o.url for o in plain.outputs] == [r["url"] for r in results] and {o.role for o in plain.outputs} == {"main"}
    layered = runninghub.check(TASK, job(model="workflow-layers"))
    assert [o.role for o in layered.outputs] == ["composite", "layer", "layer", "layer", "layer"]


@responses.activate
def test_a_video_workflows_cover_image_becomes_the_poster():
    results = [rh_result("https://rh.example.com/v.mp4", "mp4"), rh_result("https://rh.example.com/cover.png", "png")]
    responses.add(responses.POST, QUERY, json=rh_task(status="SUCCESS", results=results))
    [video] = runninghub.check(TASK, job(kind="video", model="workflow-video")).outputs
    assert video.kind == "video" and video.content_type == "video/mp4" and video.poster_url.endswith("cover.png")


@responses.activate
def test_failed_and_dead_tasks():
    responses.add(responses.POST, QUERY, json=rh_task(status="FAILED", code="1015", message="generation failed"))
    state = runninghub.check(TASK, job())
    assert isinstance(state, Failed) and state.permanent is False and "generation failed" in state.reason
    failed_reason = {"node_id": "276", "exception_type": "TypeError", "exception_message": "bad node"}
    responses.replace(
        responses.POST, QUERY, json={**rh_task(status="FAILED", code="433", message=""), "failedReason": failed_reason}
    )
    state = runninghub.check(TASK, job())
    assert state.permanent is True and "bad node" in state.reason
    responses.replace(responses.POST, QUERY, json=rh_task(task_id="", status="", code="807", message="APIKEY_TASK_NOT_FOUND"))
    assert "dead" in runninghub.check(TASK, job()).reason
    responses.replace(responses.POST, QUERY, json=rh_task(status="SUCCESS", results=[]))
    assert isinstance(runninghub.check(TASK, job()), Failed)


@responses.activate
def test_poll_side_errors_are_transient():
    responses.add(responses.POST, QUERY, status=502)
    with pytest.raises(TransientError):
        runninghub.check(TASK, job())
    responses.replace(responses.POST, QUERY, body="<html>oops</html>", status=200)
    with pytest.raises(TransientError):
        runninghub.check(TASK, job())
    responses.replace(responses.POST, QUERY, json=rh_task(task_id="", status="", code="1003", message="rate limit"))
    with pytest.raises(TransientError):
        runninghub.check(TASK, job())
