"""The combinations generator through the JSON API and MCP (issue 29): the same service
as the project page, counts and previews first, drafts when asked, wildcard lists."""

import json

import pytest
from django.test import Client

from queue_app.models import Job
from queue_app.web import tokens
from tests.conftest import make_project

pytestmark = pytest.mark.django_db

WORKFLOW = [
    {"type": "prompt", "value": "a {red|blue} __animals__"},
    {"type": "aspect_ratio", "value": "1:1"},
    {"type": "aspect_ratio", "value": "16:9"},
]


@pytest.fixture
def api(owner):
    _, raw = tokens.token_create(user=owner, name="batches")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def post(api, url, body, **headers):
    return api.post(url, data=json.dumps(body), content_type="application/json", **headers)


def mcp_call(api, name, **arguments):
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    return api.post("/mcp", data=json.dumps(message), content_type="application/json").json()["result"]


def test_the_api_previews_then_creates_once_per_idempotency_key(api, owner):
    project = make_project(owner)
    assert post(api, "/api/wildcards", {"name": "animals", "values": ["fox", "owl"]}).status_code == 200
    preview = post(api, f"/api/projects/{project.id}/generate", {"workflow": WORKFLOW, "quantity": 10, "save": True}).json()
    assert (preview["combinations"], preview["drafts"], preview["repeats"]) == (8, 10, 2)
    assert preview["previews"][1] == {"prompt": "a red fox", "references": [], "settings": {"aspect_ratio": "16:9"}}
    assert Job.objects.count() == 0
    assert api.get(f"/api/projects/{project.id}/workflow").json()["items"][0]["value"] == "a {red|blue} __animals__"
    for _ in range(2):  # the stored workflow, twice with one key: one batch
        made = post(api, f"/api/projects/{project.id}/generate", {"create": True}, HTTP_IDEMPOTENCY_KEY="k1").json()
    assert len(made["job_ids"]) == 8 and Job.objects.count() == 8


def test_bad_input_is_a_readable_400(api, owner):
    project = make_project(owner)
    url = f"/api/projects/{project.id}/generate"
    unclosed = post(api, url, {"workflow": [{"type": "prompt", "value": "a {red"}]})
    assert unclosed.status_code == 400 and "never closes" in unclosed.json()["error"]
    empty = post(api, url, {"workflow": []})
    assert empty.status_code == 400 and "no enabled prompt" in empty.json()["error"]
    seed = post(api, url, {"workflow": [{"type": "prompt", "value": "a"}], "mode": "random", "seed": -1})
    assert seed.status_code == 400 and "seed" in seed.json()["error"]


def test_the_mcp_tool_returns_previews_and_counts_of_the_stored_workflow(api, owner):
    project = make_project(owner)
    post(api, "/api/wildcards", {"name": "animals", "values": ["fox"]})
    post(api, f"/api/projects/{project.id}/generate", {"workflow": WORKFLOW, "save": True})
    refused = mcp_call(api, "generate_drafts", project_id=project.id, count=3)
    assert refused["isError"] is True  # `count` is not an argument: refused by the schema
    result = mcp_call(api, "generate_drafts", project_id=project.id, quantity=3)
    assert result["structuredContent"]["combinations"] == 4
    assert [p["prompt"] for p in result["structuredContent"]["previews"]] == ["a red fox", "a red fox", "a blue fox"]
    created = mcp_call(api, "generate_drafts", project_id=project.id, create=True, idempotency_key="once")
    again = mcp_call(api, "generate_drafts", project_id=project.id, create=True, idempotency_key="once")
    assert created["structuredContent"]["job_ids"] == again["structuredContent"]["job_ids"]
    assert len(created["structuredContent"]["job_ids"]) == 4 == Job.objects.count()


def test_wildcard_lists_are_per_user(api, owner, outsider):
    post(api, "/api/wildcards", {"name": "colours", "values": ["red", " green ", ""]})
    assert api.get("/api/wildcards").json() == {"lists": [{"name": "colours", "values": ["red", "green"]}]}
    _, raw = tokens.token_create(user=outsider, name="other")
    other = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert other.get("/api/wildcards").json() == {"lists": []}
    assert other.delete("/api/wildcards/colours").status_code == 404
    assert post(api, "/api/wildcards", {"name": "no spaces please", "values": ["x"]}).status_code == 400
    assert api.delete("/api/wildcards/colours").status_code == 200


# --- the project page's "Generate drafts" ---------------------------------------------------

PAGE_WORKFLOW = """prompt: a fox
prompt: an owl
reference: https://example.com/a.png
reference: https://example.com/b.png
aspect_ratio: 1:1
aspect_ratio: 16:9
# quality: high"""


def test_the_page_previews_the_count_then_creates_the_drafts(client, owner):
    client.force_login(owner)
    project = make_project(owner)
    url = f"/projects/{project.id}/generate"
    assert "Generate drafts" in client.get(f"/projects/{project.id}/").content.decode()
    page = client.post(url, {"workflow": PAGE_WORKFLOW, "quantity": "10", "action": "preview"}).content.decode()
    assert "8 combinations" in page, page[page.find("generate-error") :][:300]
    assert "10 drafts (2 repeats)" in page and Job.objects.count() == 0
    assert "# quality: high" in client.get(url).content.decode()  # the workflow is kept, disabled line too
    answer = client.post(url, {"workflow": PAGE_WORKFLOW, "quantity": "10", "action": "create"})
    assert answer.status_code == 302 and Job.objects.count() == 10


def test_the_page_says_what_is_wrong(client, owner):
    client.force_login(owner)
    project = make_project(owner)
    url = f"/projects/{project.id}/generate"
    bad_line = client.post(url, {"workflow": "prompt: a\nstyle: watercolour", "action": "preview"})
    assert bad_line.status_code == 400 and "line 2: write" in bad_line.content.decode()
    unclosed = client.post(url, {"workflow": "prompt: a {red", "action": "create"})
    assert unclosed.status_code == 400 and "never closes" in unclosed.content.decode() and Job.objects.count() == 0


def test_the_wildcards_page_saves_and_deletes_lists(client, owner, outsider):
    client.force_login(owner)
    assert client.post("/account/wildcards", {"name": "colours", "values": "red\ngreen"}).status_code == 302
    assert "__colours__" in client.get("/account/wildcards").content.decode()
    client.post("/account/wildcards/colours/delete")
    assert "__colours__" not in client.get("/account/wildcards").content.decode()


def test_another_users_generate_page_is_not_found(client, owner, outsider):
    client.force_login(outsider)
    assert client.get(f"/projects/{make_project(owner).id}/generate").status_code == 404
