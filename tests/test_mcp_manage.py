"""Management over MCP (issue 32): projects and provider records (a key set, never read
back), one draft, the album, and what a project's drafts can set — through the functions
the JSON API calls, refused the same way."""

import json

import pytest
from django.test import Client

from queue_app.models import AlbumItem, Job, Project, Provider, Status
from queue_app.web import tokens
from tests.conftest import make_drafts, make_job, make_project, make_provider

pytestmark = pytest.mark.django_db
KEY = "sk-secret-value-9876"


@pytest.fixture
def call(owner):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=owner, name='manage')[1]}")

    def tool(tool_name, /, **arguments):
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool_name, "arguments": arguments}}
        response = client.post("/mcp", data=json.dumps(message), content_type="application/json")
        assert KEY not in response.content.decode(), "a key came back"
        return response.json()["result"]

    return tool


def ok(result) -> dict:
    assert result["isError"] is False, result
    return result["structuredContent"]


def refused(result) -> dict:
    assert result["isError"] is True, result
    return result["structuredContent"]


def test_a_provider_key_is_set_and_never_read_back(call, owner):
    created = ok(call("save_provider", name="Mine", family="openai", api_key=KEY))
    assert created["key_hint"] == "9876" and created["has_key"] is True
    assert Provider.objects.get(id=created["id"]).api_key == KEY
    ok(call("get_provider", provider_id=created["id"]))
    ok(call("list_providers"))
    changed = ok(call("save_provider", provider_id=created["id"], paused=True, concurrency=3))
    assert (changed["paused"], changed["concurrency"]) == (True, 3)


def test_creating_needs_a_name_and_a_family_and_names_the_field(call):
    assert refused(call("save_provider", name="No family"))["field"] == "family"
    assert refused(call("save_project", kind="image"))["field"] == "name"
    assert refused(call("save_project", name="x", archived=True))["field"] == "archived"
    assert not Project.objects.exists()


def test_a_project_is_created_changed_archived_and_deleted(call, provider):
    project = ok(call("save_project", name="Posters", kind="image", provider_id=provider.id, idempotency_key="p1"))
    assert ok(call("save_project", name="Posters", kind="image", provider_id=provider.id, idempotency_key="p1")) == project
    renamed = ok(call("save_project", project_id=project["id"], name="Covers", archived=True))
    assert renamed["name"] == "Covers" and renamed["archived"] is True
    assert refused(call("save_project", project_id=project["id"]))["code"] == "invalid_argument"
    assert ok(call("delete", kind="project", id=project["id"]))["deleted"] is True
    assert refused(call("get_project", project_id=project["id"]))["code"] == "not_found"


def test_a_provider_with_work_is_not_deleted(call, project):
    make_job(project, Status.PENDING)
    assert refused(call("delete", kind="provider", id=project.provider_id))["code"] == "busy"
    assert Provider.objects.filter(id=project.provider_id).exists()


def test_a_draft_is_edited_and_deleted_but_not_once_started(call, project):
    draft, started = make_drafts(project, 2)
    Job.objects.filter(id=started.id).update(status=Status.PENDING)
    edited = ok(call("update_draft", job_id=str(draft.id), prompt="a heron", aspect_ratio="16:9"))
    assert edited["prompt"] == "a heron" and edited["settings"]["aspect_ratio"] == "16:9"
    assert refused(call("update_draft", job_id=str(started.id), prompt="x"))["code"] == "not_a_draft"
    assert refused(call("delete", kind="draft", id=str(started.id)))["code"] == "not_a_draft"
    assert ok(call("delete", kind="draft", id=str(draft.id)))["deleted"] == 1
    assert refused(call("delete", kind="draft", id=7))["code"] == "not_found"  # a draft's id is a UUID


def test_another_users_rows_are_not_found(call, outsider):
    theirs = make_project(outsider, make_provider(outsider, name="Theirs"))
    [draft] = make_drafts(theirs, 1)
    item = AlbumItem.objects.create(project=theirs, owner=outsider, kind="text", text="theirs")
    for kind, row_id in (
        ("project", theirs.id),
        ("provider", theirs.provider_id),
        ("draft", str(draft.id)),
        ("album_item", item.id),
    ):
        assert refused(call("delete", kind=kind, id=row_id))["code"] == "not_found", kind
    assert refused(call("update_draft", job_id=str(draft.id), prompt="x"))["code"] == "not_found"
    assert refused(call("save_project", project_id=theirs.id, name="x"))["code"] == "not_found"
    assert refused(call("project_options", project_id=theirs.id))["code"] == "not_found"
    assert refused(call("list_album", project_id=theirs.id))["code"] == "not_found"
    assert Project.objects.filter(id=theirs.id).exists() and AlbumItem.objects.filter(id=item.id).exists()


def test_project_options_say_what_the_projects_model_offers(call, owner):
    openai = make_provider(owner, name="OpenAI", family="openai")
    project = make_project(owner, openai, model="gpt-image-1")
    options = ok(call("project_options", project_id=project.id))
    assert options["family"] == "openai" and "gpt-image-1" in options["models"]
    assert options["options"]["aspect_ratio"] == ["1024x1024", "1536x1024", "1024x1536", "auto"]
    assert "duration" not in options["options"] and options["comfyui_inputs"] is None
    demo = make_provider(owner, name="Demo")
    other = ok(call("project_options", project_id=project.id, provider_id=demo.id))
    assert other["family"] == "demo" and other["model"] == "demo-image"


def test_a_comfyui_projects_options_list_its_bound_inputs(call, owner):
    from comfy_app.models import ComfyInstance

    project = make_project(owner, name="Flow", kind="comfyui")
    binding = {"source": "prompt", "node": "6", "input": "text", "kind": "text"}
    ComfyInstance.objects.create(project=project, base_url="http://127.0.0.1:8188", bindings=[binding])
    assert ok(call("project_options", project_id=project.id))["comfyui_inputs"] == [binding]
