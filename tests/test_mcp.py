"""The MCP endpoint: JSON-RPC 2.0 over Streamable HTTP, authenticated by the API token,
returning the same counts as the Queue Monitor."""

import json

import pytest
from django.test import Client

from queue_app.engine import heartbeats
from queue_app.models import Job, Status
from queue_app.selectors.queue import queue_status
from queue_app.web import tokens
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def mcp(owner):
    _, raw = tokens.token_create(user=owner, name="agent")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_ACCEPT="application/json, text/event-stream")

    def call(method, params=None, id_=1):
        message = {"jsonrpc": "2.0", "method": method, **({"id": id_} if id_ is not None else {})}
        if params is not None:
            message["params"] = params
        return client.post("/mcp", data=json.dumps(message), content_type="application/json")

    return call


def tool(mcp, name, **arguments):
    response = mcp("tools/call", {"name": name, "arguments": arguments})
    assert response.status_code == 200
    return response.json()["result"]


def test_it_initializes_and_lists_the_tools(mcp):
    init = mcp("initialize", {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})
    result = init.json()["result"]
    assert result["protocolVersion"] == "2025-03-26" and "tools" in result["capabilities"]
    assert mcp("notifications/initialized", id_=None).status_code == 202
    names = {t["name"] for t in mcp("tools/list").json()["result"]["tools"]}
    assert {"get_queue_status", "clear_failed_jobs", "create_drafts", "start_jobs"} <= names


def test_get_queue_status_returns_the_monitor_counts(mcp, owner, project):
    heartbeats.beat("worker")
    jobs = make_drafts(project, 4)
    Job.objects.filter(id__in=[j.id for j in jobs[:3]]).update(status=Status.FAILED)
    result = tool(mcp, "get_queue_status", breakdown="providers")
    assert result["isError"] is False
    expected = queue_status(user=owner, breakdown="providers")
    assert result["structuredContent"]["totals"] == expected["totals"]
    assert json.loads(result["content"][0]["text"])["totals"]["failed"] == 3
    assert result["structuredContent"]["providers"][0]["failed"] == 3


def test_clear_failed_jobs_in_a_scope(mcp, owner, project):
    other = make_project(owner, make_provider(owner, name="Other"), name="Other")
    mine, theirs = make_drafts(project, 2), make_drafts(other, 1)
    Job.objects.filter(id__in=[j.id for j in mine + theirs]).update(status=Status.FAILED)
    assert (
        tool(mcp, "clear_failed_jobs", scope="project", project_id=project.id, dry_run=True)["structuredContent"]["affected"] == 2
    )
    assert tool(mcp, "clear_failed_jobs", project_id=project.id)["structuredContent"]["cleared"] == 2
    refused = tool(mcp, "clear_failed_jobs", project_id=project.id, provider_id=1)
    assert refused["isError"] is True and "mutually exclusive" in refused["content"][0]["text"]
    assert Job.objects.filter(status=Status.FAILED).count() == 1


def test_create_and_start_drafts(mcp, project, inline_tasks):
    created = tool(mcp, "create_drafts", project_id=project.id, prompt="a fox", quantity=2)["structuredContent"]
    assert created["count"] == 2
    started = tool(mcp, "start_jobs", project_id=project.id, all_drafts=True)["structuredContent"]
    assert len(started["started"]) == 2
    assert not Job.objects.filter(status=Status.DRAFT).exists()


def test_a_foreign_project_is_not_found(mcp, outsider):
    theirs = make_project(outsider, make_provider(outsider))
    result = tool(mcp, "create_drafts", project_id=theirs.id, prompt="x")
    assert result["isError"] is True and "not found" in result["content"][0]["text"]
    assert not Job.objects.exists()


def test_it_needs_the_api_token(client, owner):
    client.force_login(owner)  # a session is not enough: MCP clients hold a token
    response = client.post(
        "/mcp", data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}), content_type="application/json"
    )
    assert response.status_code == 401 and "Bearer" in response["WWW-Authenticate"]
    assert client.get("/mcp").status_code == 405


def test_protocol_errors(mcp):
    assert mcp("no/such/method").json()["error"]["code"] == -32601
    assert mcp("tools/call", {"name": "nope"}).json()["error"]["code"] == -32602


def test_a_project_has_one_shape_through_the_api_and_mcp(mcp, client, owner, project):
    """The API and the tools build a project with one selector: the same fields, nested the
    same way, and each answer fits the schema it declares."""
    from jsonschema import Draft202012Validator

    from queue_app.web import mcp as mcp_endpoint

    make_drafts(project, 2)
    client.force_login(owner)
    api_detail = client.get(f"/api/projects/{project.id}").json()
    api_row = next(p for p in client.get("/api/projects").json()["projects"] if p["id"] == project.id)
    mcp_detail = tool(mcp, "get_project", project_id=project.id)["structuredContent"]
    mcp_row = next(p for p in tool(mcp, "list_projects")["structuredContent"]["projects"] if p["id"] == project.id)

    assert {k: v for k, v in api_detail.items() if k not in ("footprint", "storage", "cost")} == mcp_detail
    assert mcp_detail["counts"]["draft"] == 2 and mcp_detail["defaults"]["aspect_ratio"] == project.aspect_ratio
    assert api_row == mcp_detail  # the API's list reads the counts too
    assert mcp_row == {**mcp_detail, "counts": None}  # a page by cursor does not
    schemas = {t["name"]: t["outputSchema"] for t in mcp_endpoint.TOOLS}
    Draft202012Validator(schemas["get_project"]).validate(mcp_detail)
    Draft202012Validator(schemas["get_project"]).validate(api_detail)
    document = client.get("/api/openapi.json").json()
    ref = document["paths"]["/api/projects/{project_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    component = document["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
    assert set(component["required"]) == set(api_detail)
