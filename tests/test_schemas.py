"""One declared schema per operation, shared by the JSON API and the MCP tools; the
OpenAPI document generated from it; bad input refused cleanly, never a 500 (issue 18 §6)."""

import json

import pytest
import schemathesis
from asgiref.sync import sync_to_async
from django.test import Client
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from queue_app import limits
from queue_app.models import AlbumItem, Job, Provider, Status
from queue_app.web import mcp, mcp_tools, schemas, tokens
from tests.conftest import make_drafts, make_project, make_provider


@pytest.fixture
def token(owner):
    return tokens.token_create(user=owner, name="schemas")[1]


@pytest.fixture
def api(token):
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)


def post_raw(client, path, raw: bytes | str):
    return client.post(path, data=raw, content_type="application/json")


def post(client, path, body):
    return post_raw(client, path, json.dumps(body))


def mcp_tool(client, name, arguments):
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    response = post(client, "/mcp", message)
    assert response.status_code == 200
    return response.json()["result"]


# --- strict values, typed ids ------------------------------------------------------------


@pytest.mark.django_db
def test_the_text_false_is_not_true_on_the_api_or_in_mcp(api, project):
    make_drafts(project, 2)
    Job.objects.update(status=Status.FAILED)
    refused = post(api, "/api/queue/clear-failed", {"dry_run": "false"})
    assert refused.status_code == 400 and "dry_run" in refused.json()["error"]
    assert mcp_tool(api, "clear_failed_jobs", {"dry_run": "false"})["isError"] is True
    start = post(api, f"/api/projects/{project.id}/start", {"all_drafts": "false"})
    assert start.status_code == 400 and "all_drafts" in start.json()["error"]
    assert mcp_tool(api, "start_jobs", {"project_id": project.id, "all_drafts": "false"})["isError"] is True
    assert Job.objects.filter(status=Status.FAILED).count() == 2


@pytest.mark.django_db
def test_a_missing_or_text_project_id_says_so_instead_of_not_found(api, project):
    missing = mcp_tool(api, "create_drafts", {"prompt": "a fox"})
    said = missing["content"][0]["text"]
    assert missing["isError"] and "project_id" in said and "not found" not in said
    text = mcp_tool(api, "create_drafts", {"project_id": str(project.id), "prompt": "a fox"})
    assert text["isError"] and "project_id" in text["content"][0]["text"] and "integer" in text["content"][0]["text"]
    assert mcp_tool(api, "get_job", {"job_id": "not-a-uuid"})["isError"] is True
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_unknown_fields_are_refused_the_same_way_by_every_operation(api, project, provider):
    for path, body in (
        (f"/api/projects/{project.id}/drafts", {"prompt": "x", "bogus": 1}),
        (f"/api/projects/{project.id}/start", {"all_drafts": True, "bogus": 1}),
        ("/api/jobs/retry", {"job_ids": ["00000000-0000-0000-0000-000000000001"], "bogus": 1}),
        (f"/api/providers/{provider.id}", {"paused": True, "bogus": 1}),
        ("/api/queue/clear-failed", {"bogus": 1}),
    ):
        response = post(api, path, body)
        assert response.status_code == 400 and "bogus: unknown field" in response.json()["error"], path
    for name, arguments in (
        ("create_drafts", {"project_id": project.id, "prompt": "x", "bogus": 1}),
        ("start_jobs", {"project_id": project.id, "all_drafts": True, "bogus": 1}),
        ("save_provider", {"provider_id": provider.id, "bogus": 1}),
        ("list_projects", {"bogus": 1}),
    ):
        result = mcp_tool(api, name, arguments)
        assert result["isError"] and "bogus: unknown field" in result["content"][0]["text"], name
    assert not Job.objects.exists() and not Provider.objects.get(id=provider.id).paused


# --- hostile JSON ------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raw",
    [
        '{"prompt": "x", "quantity": NaN}',
        '{"prompt": "x", "params": {"a": Infinity}}',
        '{"prompt": "x", "params": {"a": -Infinity}}',
        '{"prompt": "\\ud800"}',
        '{"prompt": "x", "params": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"prompt": "x", "params": ' + '{"a":' * 40 + "1" + "}" * 40 + "}",
        b'{"prompt": "\xff"}',
        "[1, 2]",
        "",
    ],
)
def test_hostile_json_is_refused_with_a_json_error_and_creates_nothing(api, project, raw):
    response = post_raw(api, f"/api/projects/{project.id}/drafts", raw)
    assert response.status_code == 400, response.content[:200]
    assert response["Content-Type"] == "application/json" and response.json()["error"]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_an_oversized_body_answers_413_json_on_the_api_and_a_json_rpc_error_on_mcp(api, project):
    big = json.dumps({"prompt": "x", "params": {"a": "y" * (limits.REQUEST_BYTES + 1)}})
    response = post_raw(api, f"/api/projects/{project.id}/drafts", big)
    assert response.status_code == 413 and "limit" in response.json()["error"]
    response = post_raw(api, "/mcp", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "y" * limits.REQUEST_BYTES}))
    assert response.status_code == 413 and response.json()["error"]["code"] == mcp.INVALID_REQUEST
    assert not Job.objects.exists()


# --- whole or nothing --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_provider_update_with_one_bad_field_changes_nothing(api, provider):
    response = post(api, f"/api/providers/{provider.id}", {"paused": True, "concurrency": 0})
    assert response.status_code == 400
    provider.refresh_from_db()
    assert provider.paused is False and provider.concurrency == 1
    ok = post(api, f"/api/providers/{provider.id}", {"paused": True, "concurrency": 3}).json()
    assert ok["paused"] is True and ok["concurrency"] == 3


@pytest.mark.django_db
def test_drafts_say_which_requested_setting_the_model_changed(api, project):
    body = {"prompt": "x", "aspect_ratio": "21:9", "quality": "high"}
    created = post(api, f"/api/projects/{project.id}/drafts", body).json()
    # demo-image offers no 21:9: the closest it offers is used, and the answer says so
    assert created["resolved"]["aspect_ratio"] == "16:9" and created["resolved"]["model"] == "demo-image"
    assert created["adjusted"] == {"aspect_ratio": {"requested": "21:9", "used": "16:9"}}
    assert post(api, f"/api/projects/{project.id}/drafts", {"prompt": "x", "aspect_ratio": "7:3"}).status_code == 400


# --- one schema, two doors ---------------------------------------------------------------


@pytest.mark.django_db
def test_the_openapi_document_and_the_mcp_tools_are_generated_from_the_same_models(api):
    document = api.get("/api/openapi.json").json()
    body = document["paths"]["/api/projects/{project_id}/drafts"]["post"]["requestBody"]["content"]["application/json"]
    rest = document["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
    tool = {t["name"]: t for t in mcp.TOOLS}["create_drafts"]["inputSchema"]
    # the tool lists the same fields (not the nested `settings` copy), each made small for a
    # model to read: the bounds and the catalogue's values are checked by the same model
    assert set(tool["properties"]) == set(rest["properties"]) - {"settings"} | {"project_id", "idempotency_key"}
    for name in ("quantity", "params", "references", "provider_id", "model"):
        assert f'"type": "{tool["properties"][name]["type"]}"' in json.dumps(rest["properties"][name]), name
    assert tool["properties"]["aspect_ratio"] == {"type": "string"} and "16:9" in json.dumps(rest["properties"]["aspect_ratio"])
    assert rest["properties"]["quantity"]["maximum"] == limits.QUANTITY.high
    assert rest["additionalProperties"] is False
    generated = schemas.CreateDrafts.model_json_schema(ref_template="#/components/schemas/{model}")
    assert generated["properties"] == rest["properties"]


# --- a schema-driven fuzz of the live API ------------------------------------------------


# --- every route in the schema -----------------------------------------------------------


def api_routes() -> dict:
    """{OpenAPI path: route} of every URL pattern under /api/."""
    import re

    from tests.test_security import url_patterns

    return {
        "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route): route for route, _, _ in url_patterns() if route.startswith("api/")
    }


@pytest.mark.django_db
def test_every_api_route_is_in_the_openapi_document_with_the_methods_it_answers(api, project, provider):
    document = api.get("/api/openapi.json").json()
    assert set(api_routes()) == set(document["paths"]), "an /api/ route is missing from (or extra in) web/openapi.py"
    [draft] = make_drafts(project)
    item = AlbumItem.objects.create(project=project, owner=project.owner, kind="text", text="a haiku")
    ids = {
        "{project_id}": str(project.id),
        "{provider_id}": str(provider.id),
        "{job_id}": str(draft.id),
        "{item_id}": str(item.id),
    }
    for path, operations in document["paths"].items():
        url = path
        for name, value in ids.items():
            url = url.replace(name, value)
        answered = set()
        for method in ("get", "post", "patch"):  # not delete: it would take the rows the other paths need
            sent = api.get(url) if method == "get" else getattr(api, method)(url, data="{}", content_type="application/json")
            if sent.status_code != 405:
                answered.add(method)
        documented = set(operations) - {"delete"}
        assert answered == documented, (path, answered, documented)
        if "delete" in operations:
            assert api.generic("OPTIONS", url).status_code == 405 and "DELETE" in api.generic("OPTIONS", url)["Allow"], path


def test_the_declared_management_bodies_are_the_fields_the_services_take():
    from queue_app.services.projects import PROJECT_FIELDS
    from queue_app.services.providers import PROVIDER_FIELDS
    from queue_app.web import manage_schemas
    from queue_app.web.api_drafts import SETTING_KEYS

    assert set(manage_schemas.ProjectFields.model_fields) == set(PROJECT_FIELDS)
    assert set(manage_schemas.ProjectPatch.model_fields) == {*PROJECT_FIELDS, "archived"}
    assert set(manage_schemas.ProviderFields.model_fields) == set(PROVIDER_FIELDS)
    assert set(manage_schemas.DraftPatch.model_fields) == {"prompt", "provider_id", "settings", *SETTING_KEYS}


@pytest.fixture
def fuzz_token(live_server, django_user_model, monkeypatch):
    """A token of a user with a paused provider, a project and two drafts to fuzz."""
    from tests.conftest import make_user
    from tests.fakes.dns import use_fake_dns

    use_fake_dns(monkeypatch)  # provider addresses the fuzzer makes up resolve without a network
    owner = make_user(django_user_model, "fuzzed")
    provider = make_provider(owner, name="Fuzz")
    Provider.objects.filter(id=provider.id).update(paused=True)  # the fuzzer may start jobs: none runs
    project = make_project(owner, provider, name="Fuzz")
    make_drafts(project, 2)
    return tokens.token_create(user=owner, name="fuzz")[1]


@pytest.fixture
def live_api(live_server, fuzz_token):
    loaded = schemathesis.openapi.from_url(f"{live_server.url}/api/openapi.json")
    loaded.config.update(base_url=live_server.url, headers={"Authorization": f"Bearer {fuzz_token}"})
    return loaded


@pytest.mark.timeout(300)
def test_the_live_api_answers_every_generated_request_without_a_server_error(live_api):
    from queue_app.web.openapi import OPERATIONS

    operations = [result.ok() for result in live_api.get_all_operations()]
    documented = {f"{op.method.upper()} {op.path}" for op in OPERATIONS}
    # schemathesis leaves out the document it was loaded from; every other route is fuzzed
    assert {op.label for op in operations} == documented - {"GET /api/openapi.json"}
    for operation in operations:

        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def each(case):
            case.call_and_validate(checks=[not_a_server_error, content_type_conformance, response_schema_conformance])

        each()


def mcp_document(tool) -> dict:
    """An OpenAPI document of one MCP tool's tools/call (the JSON-RPC envelope around its
    inputSchema), so schemathesis generates its arguments as it does the API's bodies."""
    arguments = tool.arguments.model_json_schema(ref_template="#/components/schemas/{model}")
    components = arguments.pop("$defs", {})
    params = {
        "type": "object",
        "required": ["name", "arguments"],
        "additionalProperties": False,
        "properties": {"name": {"const": tool.name}, "arguments": arguments},
    }
    envelope = {
        "type": "object",
        "required": ["jsonrpc", "id", "method", "params"],
        "additionalProperties": False,
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": {"type": "integer", "minimum": 1, "maximum": 10**6},
            "method": {"const": "tools/call"},
            "params": params,
        },
    }
    reply = {"type": "object", "required": ["jsonrpc", "id", "result"]}
    operation = {
        "operationId": tool.name,
        "requestBody": {"required": True, "content": {"application/json": {"schema": envelope}}},
        "responses": {"200": {"description": "a JSON-RPC reply", "content": {"application/json": {"schema": reply}}}},
        "security": [{"token": []}],
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": f"MCP tool {tool.name}", "version": "1"},
        "paths": {"/mcp": {"post": operation}},
        "components": {"schemas": components, "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}}},
    }


@pytest.mark.timeout(600)
def test_every_mcp_tool_answers_every_generated_call_without_a_server_error(live_server, fuzz_token):
    for tool in mcp_tools.TOOLS:
        loaded = schemathesis.openapi.from_dict(mcp_document(tool))
        loaded.config.update(base_url=live_server.url, headers={"Authorization": f"Bearer {fuzz_token}"})
        [operation] = [result.ok() for result in loaded.get_all_operations()]
        fuzz_tool(tool, operation)()


def fuzz_tool(tool, operation):
    """The hypothesis test of one tool: never a 5xx or an internal error; a result fits the
    tool's outputSchema."""
    import jsonschema

    output_schema = tool.describe()["outputSchema"]

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=operation.as_strategy())
    def each(case):
        response = case.call()
        assert response.status_code < 500, (tool.name, case.body, response.text[:300])
        reply = response.json()
        assert reply.get("jsonrpc") == "2.0", reply
        # the MCP door's 500: a handler that raised answers 200 with JSON-RPC's internal error
        assert (reply.get("error") or {}).get("code") != mcp.INTERNAL_ERROR, (tool.name, case.body, reply)
        result = reply.get("result")
        if result is not None and not result.get("isError"):
            jsonschema.validate(result["structuredContent"], output_schema)

    return each


# --- the rest of issue 18 §6: inputs that used to answer 500 ------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bindings",
    [
        [{"source": 5, "node": "6", "input": "text"}],
        [{"source": "prompt", "node": "6", "input": ["text"]}],
        [{"source": "prompt", "node": {"a": 1}, "input": "text"}],
        [{"source": "prompt", "node": "6", "input": "text", "kind": ["text"]}],
    ],
)
def test_non_text_comfyui_binding_fields_are_a_form_error(owner, bindings):
    from queue_app.models import Project

    client = Client(raise_request_exception=False)
    client.force_login(owner)
    project = Project.objects.create(owner=owner, name="C", kind="comfyui")
    workflow = json.dumps({"6": {"class_type": "CLIPTextEncode", "inputs": {"text": "x"}}})
    response = client.post(f"/projects/{project.id}/comfyui/", {"workflow": workflow, "bindings": json.dumps(bindings)})
    assert response.status_code == 200 and "binding 1" in response.content.decode()
    assert not hasattr(Project.objects.get(id=project.id), "comfy") or not Project.objects.get(id=project.id).comfy.bindings


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["http://[::1", "https://[zz]/", "https://[::1]x/"])
def test_unparseable_urls_are_refused_on_test_connection_and_push_subscribe(owner, url):
    from queue_app.models import Project, PushSubscription

    client = Client(raise_request_exception=False)
    client.force_login(owner)
    project = Project.objects.create(owner=owner, name="C", kind="comfyui")
    tested = client.post(f"/projects/{project.id}/comfyui/test", {"base_url": url}, HTTP_ACCEPT="application/json")
    assert tested.status_code == 200 and tested.json()["ok"] is False and "not allowed" in tested.json()["error"]
    body = {"endpoint": url, "keys": {"p256dh": "B" * 87, "auth": "a" * 22}}
    subscribed = client.post("/push/subscribe", data=json.dumps(body), content_type="application/json")
    assert subscribed.status_code == 400 and subscribed.json()["ok"] is False
    assert not PushSubscription.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("frame", ["not json", "[1, 2", '{"type": NaN}', "[" * 100_000, "x" * 10_000])
async def test_a_bad_websocket_frame_is_answered_and_the_socket_stays_open(owner, frame, settings):
    import copy

    from tests.test_live import socket

    settings.CHANNEL_LAYERS = copy.deepcopy(settings.CHANNEL_LAYERS)
    settings.LIVE_RELAY_SECONDS = 0
    project = await sync_to_async(make_project)(owner, None)
    communicator, connected, _ = await socket(owner, project.id)
    assert connected
    assert (await communicator.receive_json_from(timeout=5))["type"] == "hello"
    await communicator.send_to(text_data=frame)
    assert (await communicator.receive_json_from(timeout=5))["type"] == "error"
    await communicator.send_json_to({"type": "ping"})
    assert (await communicator.receive_json_from(timeout=5))["type"] == "pong"
    await communicator.disconnect()
