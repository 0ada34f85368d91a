"""MCP tools for what a person does, driven by the official MCP Python SDK client over real
HTTP against a running server (issue 17)."""

import asyncio
import json

import httpx2
import pytest
from django.test import Client as DjangoClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from queue_app.models import AlbumItem, Job, Provider, Status
from queue_app.web import mcp, mcp_kit, refusals, tokens
from tests.conftest import make_drafts, make_project, make_provider, make_user


def sdk_client(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy")


def structured(result) -> dict:
    assert result.is_error is False, result.content
    return result.structured_content


def refusal(result) -> str:
    assert result.is_error is True
    return result.content[0].text


@pytest.fixture
def world(live_server, django_user_model, inline_tasks):
    owner = make_user(django_user_model, "agent-owner")
    provider = make_provider(owner, name="Demo", concurrency=2)
    project = make_project(owner, provider, name="Posters")
    idle = make_project(owner, None, name="Idle")
    token = tokens.token_create(user=owner, name="agent")[1]
    return {"url": live_server.url, "token": token, "owner": owner, "provider": provider, "project": project, "idle": idle}


# --- the agent flow ----------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_an_agent_finds_a_project_creates_starts_watches_and_retries_through_the_sdk(world, inline_tasks):
    project, provider = world["project"], world["provider"]

    async def flow():
        async with sdk_client(world["url"], world["token"]) as client:
            assert client.protocol_version in mcp.PROTOCOL_VERSIONS
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"list_projects", "get_job", "create_drafts", "start_jobs", "retry_jobs", "save_provider"} <= names

            # find things: an idle project is listed too, one page at a time
            first = structured(await client.call_tool("list_projects", {"limit": 1}))
            second = structured(await client.call_tool("list_projects", {"limit": 1, "cursor": first["nextCursor"]}))
            assert {first["projects"][0]["name"], second["projects"][0]["name"]} == {"Posters", "Idle"}
            assert second["nextCursor"] is None
            providers = structured(await client.call_tool("list_providers", {}))["providers"]
            assert [(p["id"], p["concurrency"]) for p in providers] == [(provider.id, 2)]

            # create drafts with an idempotency key: a retried call makes no duplicates
            arguments = {
                "project_id": project.id,
                "prompt": "a fox",
                "quantity": 2,
                "aspect_ratio": "21:9",
                "idempotency_key": "k1",
            }
            created = structured(await client.call_tool("create_drafts", arguments))
            again = structured(await client.call_tool("create_drafts", arguments))
            assert again == created and created["count"] == 2
            assert created["adjusted"]["aspect_ratio"] == {"requested": "21:9", "used": "16:9"}
            other = await client.call_tool("create_drafts", {**arguments, "prompt": "a cat"})
            assert "(422)" in refusal(other)
            ids = [job["id"] for job in created["jobs"]]

            started = structured(
                await client.call_tool("start_jobs", {"project_id": project.id, "job_ids": ids, "idempotency_key": "s1"})
            )
            assert sorted(started["started"]) == sorted(ids)
            return ids

    ids = asyncio.run(flow())
    assert Job.objects.filter(id__in=ids).count() == 2
    inline_tasks.run()  # the workers run what was started
    Job.objects.filter(id=ids[1]).update(status=Status.FAILED, error="simulated")

    async def watch():
        async with sdk_client(world["url"], world["token"]) as client:
            done = structured(await client.call_tool("list_jobs", {"project_id": project.id, "status": "completed"}))
            assert [job["id"] for job in done["jobs"]] == [ids[0]]
            job = await client.call_tool("get_job", {"job_id": ids[0], "include_images": True})
            detail = structured(job)
            assert detail["status"] == "completed" and detail["resolved"]["aspect_ratio"] == "16:9"
            assert detail["attempt_log"][0]["outcome"] == "completed"
            [output] = detail["outputs"]
            assert output["url"].endswith(f"/album/{output['id']}/file") and output["content_type"] == "image/png"
            kinds = [item.type for item in job.content]
            assert kinds == ["text", "resource_link", "image"]

            failed = structured(await client.call_tool("get_job", {"job_id": ids[1]}))
            assert failed["status"] == "failed" and failed["error"] == "simulated"
            retried = structured(await client.call_tool("retry_jobs", {"job_ids": [ids[1]]}))
            assert retried == {"retried": [ids[1]], "skipped": 0}

            paused = structured(await client.call_tool("save_provider", {"provider_id": provider.id, "paused": True}))
            assert paused["paused"] is True
            sized = structured(await client.call_tool("save_provider", {"provider_id": provider.id, "concurrency": 5}))
            assert sized["concurrency"] == 5

    asyncio.run(watch())
    assert AlbumItem.objects.filter(job_id=ids[0]).count() == 1
    inline_tasks.run()  # the retried job runs again
    assert Job.objects.get(id=ids[1]).status == Status.COMPLETED
    assert Provider.objects.filter(id=provider.id, paused=True, concurrency=5).exists()


@pytest.mark.timeout(60)
def test_another_users_things_are_not_found_through_the_sdk(world, django_user_model):
    outsider = make_user(django_user_model, "agent-outsider")
    theirs = make_provider(outsider, name="Theirs")
    their_project = make_project(outsider, theirs, name="Theirs")
    [their_job] = make_drafts(their_project, 1)
    token = tokens.token_create(user=outsider, name="o")[1]

    async def probe():
        async with sdk_client(world["url"], token) as client:
            assert structured(await client.call_tool("list_projects", {}))["projects"][0]["id"] == their_project.id
            for name, arguments in (
                ("get_project", {"project_id": world["project"].id}),
                ("get_provider", {"provider_id": world["provider"].id}),
                ("create_drafts", {"project_id": world["project"].id, "prompt": "x"}),
                ("save_provider", {"provider_id": world["provider"].id, "paused": True}),
                ("list_jobs", {"project_id": world["project"].id}),
            ):
                assert "not found" in refusal(await client.call_tool(name, arguments)), name
        async with sdk_client(world["url"], world["token"]) as client:
            assert "not found" in refusal(await client.call_tool("get_job", {"job_id": str(their_job.id)}))

    asyncio.run(probe())
    assert not Provider.objects.get(id=world["provider"].id).paused


# --- declared schemas ------------------------------------------------------------------


def test_every_tool_declares_valid_schemas_and_annotations_true_for_every_argument():
    effective = {}
    for tool in mcp.TOOLS:
        Draft202012Validator.check_schema(tool["inputSchema"])
        Draft202012Validator.check_schema(tool["outputSchema"])
        assert tool["inputSchema"]["type"] == tool["outputSchema"]["type"] == "object"
        assert tool["description"]
        # a hint left out is the specification's default
        effective[tool["name"]] = {**mcp_kit.DEFAULT_HINTS, **tool["annotations"]}
    assert effective["clear_failed_jobs"]["destructiveHint"] is True
    assert effective["start_jobs"]["openWorldHint"] is True
    assert effective["list_jobs"]["readOnlyHint"] is True and effective["list_jobs"]["openWorldHint"] is False
    # a repeat with all_drafts (or of a job that failed again) picks up new rows: not idempotent
    for name in ("start_jobs", "retry_jobs", "retry_failed_jobs", "clear_failed_jobs", "create_drafts", "save_project"):
        assert effective[name]["idempotentHint"] is False, name
    assert effective["delete"]["destructiveHint"] is True and effective["delete"]["idempotentHint"] is True
    drafts = by_name("create_drafts")["inputSchema"]["properties"]
    assert {"provider_id", "model", "aspect_ratio", "params", "references", "idempotency_key", "quantity"} <= set(drafts)
    assert "enum" not in drafts["aspect_ratio"], "the catalogue is project_options' to list"


def by_name(name: str) -> dict:
    return next(tool for tool in mcp.TOOLS if tool["name"] == name)


@pytest.mark.django_db
def test_the_tool_list_a_model_reads_stays_under_12_kb(owner):
    raw = tokens.token_create(user=owner, name="size")[1]
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    response = DjangoClient(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/mcp", data=json.dumps(message), content_type="application/json"
    )
    size = len(response.content)
    tools = response.json()["result"]["tools"]
    print(f"tools/list: {size} bytes, {len(tools)} tools, {size // len(tools)} bytes a tool")
    assert size < 12 * 1024


# --- a schema-driven fuzz of the tools ----------------------------------------------------


def _strategy_for(schema: dict):
    """Arguments near the declared schema: its properties with values of any JSON type."""
    values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=30),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
        max_leaves=8,
    )
    names = sorted(schema.get("properties", {})) + ["bogus"]
    return st.dictionaries(st.sampled_from(names), values, max_size=4)


@pytest.fixture
def fuzz_client(owner):
    provider = make_provider(owner, name="Fuzz")
    Provider.objects.filter(id=provider.id).update(paused=True)  # nothing runs
    make_drafts(make_project(owner, provider), 2)
    raw = tokens.token_create(user=owner, name="fuzz")[1]
    return DjangoClient(HTTP_AUTHORIZATION=f"Bearer {raw}", raise_request_exception=False)


@pytest.mark.django_db
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_tool_calls_never_answer_a_json_rpc_internal_error(data, fuzz_client):
    tool = data.draw(st.sampled_from(mcp.TOOLS))
    arguments = data.draw(_strategy_for(tool["inputSchema"]))
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool["name"], "arguments": arguments}}
    response = fuzz_client.post("/mcp", data=json.dumps(message), content_type="application/json")
    reply = response.json()
    if response.status_code == 400 and "\\u0000" in json.dumps(arguments):
        # A NUL character is refused at the door for every body (PostgreSQL cannot store it):
        # a JSON-RPC parse error that says so, never an internal error.
        assert reply["error"]["code"] == -32700 and "NUL" in reply["error"]["message"], reply
        return
    assert response.status_code == 200, (tool["name"], arguments)
    assert "error" not in reply, (tool["name"], arguments, reply)
    result = reply["result"]
    if not result["isError"]:
        Draft202012Validator(tool["outputSchema"]).validate(result["structuredContent"])
    else:  # every refusal is one a program can branch on
        refused = result["structuredContent"]
        assert refused["code"] in refusals.CODES and isinstance(refused["retriable"], bool), refused
        assert refused["message"] in result["content"][0]["text"]


# --- start_jobs with wait: hear the batch finish ------------------------------------------


class BackgroundWorker:
    """Runs the captured tasks as a worker process would, while the call waits."""

    def __init__(self, tasks):
        import threading

        self.tasks, self.stop = tasks, threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        from django.db import connection

        try:
            while not self.stop.is_set():
                if not self.tasks.run(limit=1):
                    self.stop.wait(0.05)
        finally:
            connection.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


@pytest.mark.timeout(120)
def test_start_jobs_with_wait_streams_progress_until_the_jobs_finish(world, inline_tasks):
    project = world["project"]
    jobs = make_drafts(project, 3)
    heard = []

    async def progress(done, total, message):
        heard.append((done, total, message))

    async def start_and_wait():
        async with sdk_client(world["url"], world["token"]) as client:
            arguments = {"project_id": project.id, "all_drafts": True, "wait": True, "wait_seconds": 60}
            return structured(await client.call_tool("start_jobs", arguments, progress_callback=progress))

    with BackgroundWorker(inline_tasks):
        result = asyncio.run(start_and_wait())
    assert sorted(result["started"]) == sorted(str(job.id) for job in jobs)
    assert result["finished"] == {"completed": 3} and result["timed_out"] is False
    assert heard and heard[-1][:2] == (3, 3) and "3 of 3 finished" in heard[-1][2]
    assert [done for done, _, _ in heard] == sorted({done for done, _, _ in heard})  # only forward
    assert Job.objects.filter(project=project, status=Status.COMPLETED).count() == 3


@pytest.mark.timeout(60)
def test_a_wait_that_times_out_says_so(world, inline_tasks):
    project = world["project"]
    make_drafts(project, 1)
    Provider.objects.filter(id=world["provider"].id).update(paused=True)  # nothing will run

    async def start_and_wait():
        async with sdk_client(world["url"], world["token"]) as client:
            arguments = {"project_id": project.id, "all_drafts": True, "wait": True, "wait_seconds": 1}
            return structured(await client.call_tool("start_jobs", arguments))

    result = asyncio.run(start_and_wait())
    assert result["timed_out"] is True and result["finished"] == {"pending": 1}
