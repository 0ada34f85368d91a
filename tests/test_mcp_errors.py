"""Every refusal is one an agent can branch on: {code, message, retriable, status, field?}
in structuredContent of the isError result (the text kept for people), and the same words
beside the JSON API's "error" (issue 32)."""

import json

import pytest
from django.test import Client

from queue_app.models import Provider
from queue_app.web import tokens
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def token(owner):
    return tokens.token_create(user=owner, name="errors")[1]


@pytest.fixture
def call(token):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def tool(name, **arguments):
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        result = client.post("/mcp", data=json.dumps(message), content_type="application/json").json()["result"]
        assert result["isError"] is True, result
        return result

    return tool


def test_an_unknown_project_is_not_found_and_names_the_argument(call):
    refused = call("get_project", project_id=10**9)
    assert refused["structuredContent"] == {
        "code": "not_found",
        "message": "project not found",
        "retriable": False,
        "status": 404,
        "field": "project_id",
    }
    assert refused["content"][0]["text"] == "project not found (404)"


def test_a_bad_argument_names_its_field(call, project):
    refused = call("create_drafts", project_id=project.id, prompt="x", quantity="3")["structuredContent"]
    assert (refused["code"], refused["field"], refused["retriable"]) == ("invalid_argument", "quantity", False)


def test_a_reused_idempotency_key_is_not_retriable_and_says_which_argument(call, project):
    first = {"project_id": project.id, "prompt": "a fox", "idempotency_key": "k"}
    from queue_app.services.idempotency import idempotent

    idempotent(user=project.owner, key="k", scope=f"drafts:{project.id}", body={"prompt": "a cat"}, run=lambda: ({}, 201))
    refused = call("create_drafts", **first)["structuredContent"]
    assert (refused["code"], refused["field"], refused["retriable"], refused["status"]) == (
        "key_reused",
        "idempotency_key",
        False,
        422,
    )


def test_a_provider_that_still_has_work_is_busy_and_retriable(token, owner, project):
    make_drafts(project, 1)
    from queue_app.models import Job, Status

    Job.objects.filter(project=project).update(status=Status.PENDING)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.delete(f"/api/providers/{project.provider_id}")
    body = response.json()
    assert response.status_code == 409 and body["code"] == "busy" and body["retriable"] is True
    assert body["error"].startswith(Provider.objects.get(id=project.provider_id).name)


def test_the_api_answers_the_same_words(token, outsider):
    theirs = make_project(outsider, make_provider(outsider))
    response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"/api/projects/{theirs.id}")
    assert response.status_code == 404
    assert response.json() == {
        "error": "project not found",
        "code": "not_found",
        "retriable": False,
        "status": 404,
        "field": "project_id",
    }
