"""Request/response shapes of the provider APIs, taken from ../shared/providers/*.md, for
`responses` mocks. Ids are made up; the structure is the recorded one."""

import base64

from queue_app.providers.base import ResolvedJob
from tests.fakes.async_provider import png

PNG = png()
PNG_B64 = base64.b64encode(PNG).decode()


def resolved(family: str, **fields) -> ResolvedJob:
    values = dict(
        job_id="00000000-0000-0000-0000-000000000042",
        provider_id=1,
        family=family,
        kind="image",
        model="",
        prompt="a red fox in snow",
        api_key="test-key",
    )
    values.update(fields)
    return ResolvedJob(**values)


# --- OpenAI (openai.md) ---


def openai_images(*items):
    return {
        "created": 1767225600,
        "data": list(items) or [{"b64_json": PNG_B64, "revised_prompt": None}],
        "background": "opaque",
        "output_format": "png",
        "quality": "high",
        "size": "1024x1024",
        "usage": {"input_tokens": 50, "output_tokens": 4160, "total_tokens": 4210},
    }


def openai_error(message, type_="invalid_request_error", code=None, param=None):
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# --- Gemini (google-gemini.md) ---


def gemini_image(*parts, finish="STOP"):
    parts = list(parts) or [
        {"text": "Here is your image", "thought": True},
        {"inlineData": {"mimeType": "image/png", "data": PNG_B64}},
    ]
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 1290, "totalTokenCount": 1302},
        "modelVersion": "gemini-3-pro-image-preview",
        "responseId": "abc123",
    }


def gemini_error(code, status, message, *details):
    return {"error": {"code": code, "message": message, "status": status, "details": list(details)}}


# --- RunningHub (runninghub.md) ---


def rh_task(task_id="2047154150516862978", status="RUNNING", results=None, code="", message=""):
    return {
        "taskId": task_id,
        "status": status,
        "errorCode": code,
        "errorMessage": message,
        "results": results,
        "clientId": "",
        "promptTips": "",
    }


def rh_result(url, output_type="png", node="9"):
    return {"url": url, "outputType": output_type, "nodeId": node, "text": None}


# --- Civitai v2 (civitai.md) ---


def civitai_workflow(status="processing", images=(), step_status=None, reason=None, workflow_id="wf_01HXYZ"):
    job = {"id": "j1", "status": step_status or status, "cost": 4, "queuePosition": None}
    if reason:
        job["reason"] = reason
    return {
        "id": workflow_id,
        "status": status,
        "cost": {},
        "transactions": [],
        "tags": ["rs-job-00000000-0000-0000-0000-000000000042"],
        "steps": [
            {
                "name": "$0",
                "$type": "imageGen",
                "status": step_status or status,
                "output": {
                    "images": [
                        {
                            "id": f"aa6e-{n}.jpg",
                            "width": 1024,
                            "height": 1024,
                            "url": url,
                            "urlExpiresAt": "2027-04-15T17:18:54Z",
                            "available": True,
                        }
                        for n, url in enumerate(images)
                    ],
                    "errors": [],
                },
                "jobs": [job],
            }
        ],
    }


# --- Replicate (replicate.md) ---


def replicate_prediction(status="starting", output=None, error=None, prediction_id="vgcm4plb7tgzlyznry5d5jkgvu", **extra):
    body = {
        "id": prediction_id,
        "model": "black-forest-labs/flux-schnell",
        "version": "39ed52f2",
        "input": {"prompt": "a corgi"},
        "logs": "",
        "output": output,
        "error": error,
        "status": status,
        "data_removed": False,
        "created_at": "2026-01-01T00:00:00.000Z",
        "urls": {
            "get": f"https://api.replicate.com/v1/predictions/{prediction_id}",
            "cancel": f"https://api.replicate.com/v1/predictions/{prediction_id}/cancel",
        },
    }
    body.update(extra)
    return body
