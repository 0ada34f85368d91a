"""Done-when of issue 32: the official MCP SDK client walks an agent from an empty account
to downloaded outputs over real HTTP: create a provider record and a project, ask what the
project's drafts can set, draft (edit one, delete one), start and wait, read each output's
bytes (resources/read, and the short-lived download URL with no credentials), and delete
one album item."""

import asyncio
import base64
import json

import httpx2
import pytest

from queue_app.models import AlbumItem, Job, Status
from queue_app.web import tokens
from tests.factories import make_user
from tests.test_mcp_tools import BackgroundWorker, sdk_client, structured

KEY = "demo-key-NEVER-SHOWN-1234"


@pytest.mark.timeout(180)
def test_an_agent_goes_from_an_empty_account_to_downloaded_outputs(live_server, django_user_model, inline_tasks):
    user = make_user(django_user_model, "newcomer")
    token = tokens.token_create(user=user, name="agent")[1]
    said: list[str] = []  # every answer's text: the key must never be in one

    async def call(client, name, arguments):
        result = await client.call_tool(name, arguments)
        said.append(json.dumps(result.model_dump(mode="json")))
        return structured(result)

    async def walk():
        async with sdk_client(live_server.url, token) as client:
            assert (await call(client, "list_projects", {}))["projects"] == []
            assert (await call(client, "list_providers", {}))["providers"] == []

            provider = await call(
                client,
                "save_provider",
                {"name": "Demo", "family": "demo", "api_key": KEY, "concurrency": 2, "options": {"latency_ms": 0}},
            )
            assert provider["has_key"] is True and provider["key_hint"] == "1234"
            project = await call(client, "save_project", {"name": "Posters", "kind": "image", "provider_id": provider["id"]})
            options = await call(client, "project_options", {"project_id": project["id"]})
            assert "demo-image" in options["models"] and "16:9" in options["options"]["aspect_ratio"]

            drafts = await call(
                client,
                "create_drafts",
                {
                    "project_id": project["id"],
                    "prompt": "a fox",
                    "quantity": 3,
                    "aspect_ratio": options["options"]["aspect_ratio"][0],
                },
            )
            first, second, third = (job["id"] for job in drafts["jobs"])
            edited = await call(client, "update_draft", {"job_id": first, "prompt": "a fox at dawn"})
            assert edited["prompt"] == "a fox at dawn"
            assert (await call(client, "delete", {"kind": "draft", "id": third}))["deleted"] == 1

            progress = []
            started = await client.call_tool(
                "start_jobs",
                {"project_id": project["id"], "all_drafts": True, "wait": True, "wait_seconds": 60},
                progress_callback=lambda done, total, message: _heard(progress, done),
            )
            started = structured(started)
            assert sorted(started["started"]) == sorted([first, second])
            assert started["finished"] == {"completed": 2} and started["timed_out"] is False and progress

            downloaded = {}
            async with httpx2.AsyncClient(timeout=30) as anonymous:
                for job_id in (first, second):
                    job = await call(client, "get_job", {"job_id": job_id})
                    for output in job["outputs"]:
                        read = await client.read_resource(output["url"])
                        data = base64.b64decode(read.contents[0].blob)
                        fetched = await anonymous.get(output["download_url"])  # no token at all
                        assert fetched.status_code == 200 and fetched.content == data
                        downloaded[output["id"]] = data

            album = await call(client, "list_album", {"project_id": project["id"]})
            assert {item["id"] for item in album["items"]} == set(downloaded)
            gone = album["items"][0]["id"]
            assert (await call(client, "delete", {"kind": "album_item", "id": gone}))["deleted"] is True
            left = await call(client, "list_album", {"project_id": project["id"]})
            return downloaded, gone, [item["id"] for item in left["items"]]

    with BackgroundWorker(inline_tasks):
        downloaded, gone, left = asyncio.run(walk())
    assert len(downloaded) == 2 and left == [item for item in downloaded if item != gone]
    for item in AlbumItem.objects.filter(id__in=left):
        with item.file.open("rb") as handle:
            assert handle.read() == downloaded[item.id]  # the bytes the agent read are the album's
    assert Job.objects.filter(owner=user, status=Status.COMPLETED).count() == 2
    assert not any(KEY in text for text in said), "the provider key came back in an answer"


async def _heard(progress: list, done) -> None:
    progress.append(done)
