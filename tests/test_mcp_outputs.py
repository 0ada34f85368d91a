"""An agent reads what it made with its token alone: resources/read for each output link
(and a template for any), the file streamed through the JSON API with the token, and a
short-lived signed download URL that needs no credentials (issue 32)."""

import base64
import json

import pytest
from django.core import signing
from django.core.files.base import ContentFile
from django.test import Client

from queue_app.models import AlbumItem
from queue_app.web import album_api, mcp, mcp_resources, tokens
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


def stored(project, data: bytes, *, job=None, kind="video", content_type="video/mp4", index=0):
    item = AlbumItem(
        project=project, owner=project.owner, job=job, kind=kind, content_type=content_type, size=len(data), output_index=index
    )
    item.file.save("out.bin", ContentFile(data), save=False)
    item.save()
    return item


@pytest.fixture
def token(owner):
    return tokens.token_create(user=owner, name="outputs")[1]


@pytest.fixture
def rpc(token):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def send(method, params=None):
        message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        return client.post("/mcp", data=json.dumps(message), content_type="application/json").json()

    return send


def test_get_job_links_each_output_to_a_resource_the_agent_can_read(rpc, project):
    [job] = make_drafts(project, 1)
    video = stored(project, b"\x00\x01video-bytes", job=job)
    text = AlbumItem.objects.create(project=project, owner=project.owner, job=job, kind="text", text="a haiku", output_index=1)
    result = rpc("tools/call", {"name": "get_job", "arguments": {"job_id": str(job.id)}})["result"]
    outputs = result["structuredContent"]["outputs"]
    [link] = [item for item in result["content"] if item["type"] == "resource_link"]
    assert link["uri"] == outputs[0]["url"] == f"http://testserver/api/album/{video.id}/file"
    read = rpc("resources/read", {"uri": link["uri"]})["result"]["contents"][0]
    assert base64.b64decode(read["blob"]) == b"\x00\x01video-bytes" and read["mimeType"] == "video/mp4"
    read = rpc("resources/read", {"uri": outputs[1]["url"]})["result"]["contents"][0]
    assert read["text"] == "a haiku" and text.id == outputs[1]["id"]


def test_a_large_file_is_never_inlined_but_linked_for_download(rpc, project, monkeypatch):
    monkeypatch.setattr(mcp_resources, "INLINE_BYTES", 10)
    item = stored(project, b"v" * 11)
    [content] = rpc("resources/read", {"uri": f"/api/album/{item.id}/file"})["result"]["contents"]
    assert content["mimeType"] == "text/uri-list" and "blob" not in content
    response = Client().get(content["text"].replace("http://testserver", ""))
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"v" * 11


def test_resources_are_listed_by_key_and_have_a_template(rpc, project):
    items = [stored(project, bytes([n])) for n in range(3)]
    first = rpc("resources/list", {})["result"]
    assert [r["uri"].rsplit("/", 2)[1] for r in first["resources"]] == [str(i.id) for i in reversed(items)]
    [template] = rpc("resources/templates/list")["result"]["resourceTemplates"]
    assert template["uriTemplate"] == "http://testserver/api/album/{item_id}/file"
    init = rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})
    assert "resources" in init["result"]["capabilities"]


def test_another_users_output_is_not_found_by_any_door(rpc, token, outsider):
    theirs = stored(make_project(outsider, make_provider(outsider)), b"secret")
    error = rpc("resources/read", {"uri": f"http://testserver/api/album/{theirs.id}/file"})["error"]
    assert error["code"] == mcp.RESOURCE_NOT_FOUND
    assert rpc("resources/read", {"uri": "file:///etc/passwd"})["error"]["code"] == mcp.RESOURCE_NOT_FOUND
    assert Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"/api/album/{theirs.id}/file").status_code == 404


def test_the_file_streams_with_the_token_and_refuses_without_one(token, project):
    item = stored(project, b"frames")
    response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"/api/album/{item.id}/file")
    assert response.status_code == 200 and response.streaming and b"".join(response.streaming_content) == b"frames"
    assert response["Content-Type"] == "video/mp4" and response["X-Content-Type-Options"] == "nosniff"
    assert Client().get(f"/api/album/{item.id}/file").status_code == 401


def test_a_download_url_works_without_credentials_for_its_item_only_until_it_expires(owner, project, monkeypatch):
    item, other = stored(project, b"one"), stored(project, b"two")
    url = album_api.signed_url("", owner, item.id)
    assert b"".join(Client().get(url).streaming_content) == b"one"
    signature = url.split("sig=")[1]
    assert Client().get(f"/api/album/{other.id}/file?sig={signature}").json()["code"] == "forbidden"
    assert Client().get(f"{url}x").status_code == 403
    monkeypatch.setattr(signing.TimestampSigner, "unsign", lambda *a, **k: (_ for _ in ()).throw(signing.SignatureExpired()))
    assert Client().get(url).status_code == 403
    AlbumItem.objects.filter(id=item.id).delete()
    monkeypatch.undo()
    assert Client().get(url).status_code == 404  # deleted since: nothing to hand out


def test_the_api_lists_the_album_by_key_and_deletes_an_item(token, project):
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    items = [stored(project, bytes([n])) for n in range(3)]
    first = api.get(f"/api/album?project_id={project.id}&limit=2").json()
    second = api.get(f"/api/album?limit=2&cursor={first['nextCursor']}").json()
    assert [i["id"] for i in first["items"] + second["items"]] == [i.id for i in reversed(items)]
    assert second["nextCursor"] is None and first["items"][0]["download_url"].startswith("http://testserver/api/album/")
    assert api.delete(f"/api/album/{items[0].id}").json() == {"deleted": True, "freed": 1}
    assert not AlbumItem.objects.filter(id=items[0].id).exists()
