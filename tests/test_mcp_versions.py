"""Answers a client can read in the version it negotiated; start-and-wait that says plainly
when it did not wait; metadata that says how tokens are really issued (issue 32)."""

import json

import pytest
from django.core.files.base import ContentFile
from django.test import Client

from queue_app.models import AlbumItem
from queue_app.web import mcp, tokens
from tests.conftest import make_drafts

pytestmark = pytest.mark.django_db
INIT = {"capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}


@pytest.fixture
def client(owner):
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=owner, name='versions')[1]}")


def rpc(client, method, params=None, **headers):
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    return client.post("/mcp", data=json.dumps(message), content_type="application/json", **headers)


def a_job_with_a_file(project):
    [job] = make_drafts(project, 1)
    item = AlbumItem(project=project, owner=project.owner, job=job, kind="image", content_type="image/png", size=3)
    item.file.save("out.png", ContentFile(b"png"), save=False)
    item.save()
    return job


@pytest.mark.parametrize("version", ["2025-03-26", "2024-11-05"])
def test_a_client_of_an_older_version_never_meets_a_newer_field(client, project, version):
    init = rpc(client, "initialize", {**INIT, "protocolVersion": version})
    assert init.json()["result"]["protocolVersion"] == version
    session = {"HTTP_MCP_SESSION_ID": init["Mcp-Session-Id"]}
    tools = rpc(client, "tools/list", **session).json()["result"]["tools"]
    assert not any("outputSchema" in tool or "title" in tool for tool in tools)
    assert any("annotations" in tool for tool in tools) == (version >= "2025-03-26")
    job = a_job_with_a_file(project)
    result = rpc(client, "tools/call", {"name": "get_job", "arguments": {"job_id": str(job.id)}}, **session).json()["result"]
    assert "structuredContent" not in result and [item["type"] for item in result["content"]] == ["text"]
    assert json.loads(result["content"][0]["text"])["outputs"][0]["url"].endswith("/file")  # the link is in the text
    refused = rpc(client, "tools/call", {"name": "get_project", "arguments": {"project_id": 10**9}}, **session)
    assert "structuredContent" not in refused.json()["result"]


def test_a_client_that_names_its_version_gets_what_that_version_defines(client, project):
    init = rpc(client, "initialize", {**INIT, "protocolVersion": "2025-06-18"})
    assert "Mcp-Session-Id" not in init  # it names its version on every request
    job = a_job_with_a_file(project)
    arguments = {"name": "get_job", "arguments": {"job_id": str(job.id)}}
    result = rpc(client, "tools/call", arguments, HTTP_MCP_PROTOCOL_VERSION="2025-06-18").json()["result"]
    assert result["structuredContent"]["id"] == str(job.id)
    assert [item["type"] for item in result["content"]] == ["text", "resource_link"]
    tools = rpc(client, "tools/list", HTTP_MCP_PROTOCOL_VERSION="2025-11-25").json()["result"]["tools"]
    assert all("outputSchema" in tool for tool in tools)


def test_a_session_id_we_did_not_give_is_refused(client):
    response = rpc(client, "tools/list", HTTP_MCP_SESSION_ID="forged")
    assert response.status_code == 404 and response.json()["error"]["code"] == mcp.INVALID_REQUEST


def test_start_and_wait_from_a_json_only_client_says_it_must_poll(client, project):
    [draft] = make_drafts(project, 1)
    arguments = {"project_id": project.id, "job_ids": [str(draft.id)], "wait": True}
    response = rpc(client, "tools/call", {"name": "start_jobs", "arguments": arguments}, HTTP_ACCEPT="application/json")
    assert response["Content-Type"] == "application/json"
    started = response.json()["result"]["structuredContent"]
    assert started["started"] == [str(draft.id)] and started["finished"] is None
    assert started["poll"].startswith("not waited") and "list_jobs" in started["poll"]


def test_the_resource_metadata_names_no_authorization_server_because_none_issues_tokens():
    body = Client().get("/.well-known/oauth-protected-resource").json()
    assert "authorization_servers" not in body
    assert body["bearer_methods_supported"] == ["header"] and body["resource_documentation"].endswith("/account/")
