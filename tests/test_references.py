"""Reference images of drafts (issue 12): uploaded (several at once) or picked from the
album, stored once per content per user, typed from their bytes, shown as thumbnails,
checked the same way on the page and the API, and handed to the providers (as data: URIs)
and to ComfyUI image bindings."""

import base64
import io
import json

import pytest
import responses
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import SimpleUploadedFile
from PIL import Image

from queue_app.engine import snapshot
from queue_app.models import AlbumItem, Job, Reference, Status
from queue_app.providers import openai, replicate
from queue_app.services import references
from queue_app.services.drafts import jobs_create_drafts
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_start
from queue_app.services.storage import reference_store
from tests.conftest import make_drafts, make_project, make_provider
from tests.fakes.dns import use_fake_dns

pytestmark = pytest.mark.django_db(transaction=True)

HTML = b"<!doctype html><html><body><script>alert(1)</script></body></html>"
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'


def image(fmt="PNG", color=(10, 120, 200), size=(6, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format=fmt)
    return out.getvalue()


def data_uri(data: bytes, claimed="image/png") -> str:
    return f"data:{claimed};base64,{base64.b64encode(data).decode()}"


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def upload(name, data, content_type="image/png"):
    return SimpleUploadedFile(name, data, content_type=content_type)


def stored_files(settings, owner) -> list:
    folder = settings.MEDIA_ROOT / "references" / str(owner.id)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# --- Storing --------------------------------------------------------------------------------


def test_the_same_picture_uploaded_twice_is_one_row_and_one_file(owner, settings):
    data = image()
    first = reference_store(owner, data)
    second = reference_store(owner, data)
    assert first == second
    assert Reference.objects.filter(owner=owner).count() == 1
    assert stored_files(settings, owner) == [f"{first}.png"]


def test_the_type_and_size_come_from_the_bytes_not_the_name(signed_in, owner, project):
    jpeg = image("JPEG")
    body = signed_in.post(
        f"/projects/{project.id}/drafts",
        {"prompt": "p", "quantity": "1", "reference_files": [upload("lies.png", jpeg, "image/png")]},
        HTTP_X_REQUESTED_WITH="fetch",
    ).json()
    assert body["created"] == 1
    row = Reference.objects.get()
    assert (row.content_type, row.size, row.width, row.height) == ("image/jpeg", len(jpeg), 6, 4)
    assert row.file.name.endswith(".jpg")


@pytest.mark.parametrize(
    "data, says",
    [(HTML, "HTML"), (SVG, "not an image"), (b"", "empty"), (b"\x00\x01 not a picture", "not an image")],
    ids=["html", "svg", "empty", "junk"],
)
def test_anything_but_an_image_is_refused_with_the_reason_and_nothing_is_kept(signed_in, project, data, says):
    body = signed_in.post(
        f"/projects/{project.id}/drafts",
        {"prompt": "p", "quantity": "1", "reference_files": [upload("picture.png", data)]},
        HTTP_X_REQUESTED_WITH="fetch",
    ).json()
    assert body["created"] == 0
    assert says in body["messages"][0]["text"] and "'picture.png'" in body["messages"][0]["text"]
    assert not Reference.objects.exists() and not Job.objects.exists()


def test_a_wav_named_png_is_refused_as_what_it_is(owner):
    import struct

    wav = (
        b"RIFF"
        + struct.pack("<I", 36)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8)
        + b"data\x00\x00\x00\x00"
    )
    with pytest.raises(ServiceError, match="not an image.*audio/wav"):
        reference_store(owner, wav, label="song.png")


def test_the_size_and_count_limits_are_declared_once_and_enforced(signed_in, owner, project, monkeypatch):
    monkeypatch.setattr(references, "MAX_REFERENCE_BYTES", 100)
    body = signed_in.post(
        f"/projects/{project.id}/drafts",
        {"prompt": "p", "quantity": "1", "reference_files": [upload("big.png", image(size=(64, 64)))]},
        HTTP_X_REQUESTED_WITH="fetch",
    ).json()
    assert "a reference image may be" in body["messages"][0]["text"]
    monkeypatch.setattr(references, "MAX_REFERENCES", 2)
    files = [upload(f"{i}.png", image(color=(i, i, i))) for i in range(3)]
    body = signed_in.post(
        f"/projects/{project.id}/drafts",
        {"prompt": "p", "quantity": "1", "reference_files": files},
        HTTP_X_REQUESTED_WITH="fetch",
    ).json()
    assert "at most 2" in body["messages"][0]["text"]
    assert not Reference.objects.exists() and not Job.objects.exists()  # refused before a file was stored


# --- On the page ----------------------------------------------------------------------------


def test_several_uploads_and_an_album_pick_go_on_every_draft_and_show_as_thumbnails(signed_in, owner, project):
    item = AlbumItem.objects.create(project=project, owner=owner, kind="image", content_type="image/png", file="album/x.png")
    files = [upload("a.png", image(color=(1, 2, 3))), upload("b.webp", image("WEBP"))]
    form = {"prompt": "one\ntwo", "quantity": "1", "per_line": "on", "reference": [f"album:{item.id}"], "reference_files": files}
    body = signed_in.post(f"/projects/{project.id}/drafts", form, HTTP_X_REQUESTED_WITH="fetch").json()
    assert body["created"] == 2
    shas = {row.sha256: row.content_type for row in Reference.objects.all()}
    assert sorted(shas.values()) == ["image/png", "image/webp"]
    for job in Job.objects.all():
        assert job.references[0] == f"album:{item.id}"
        assert {value[4:] for value in job.references[1:]} == set(shas)
    html = signed_in.get(f"/projects/{project.id}/?fragment=1").content.decode()
    assert html.count('class="ref-thumb"') == 6
    assert f'src="/album/{item.id}/file"' in html and all(f'src="/references/{sha}"' in html for sha in shas)


def test_a_thumbnail_is_served_sandboxed_to_its_owner_only(client, owner, outsider):
    sha = reference_store(owner, image())
    client.force_login(owner)
    response = client.get(f"/references/{sha}")
    assert response.status_code == 200 and response["Content-Type"] == "image/png"
    assert response["X-Content-Type-Options"] == "nosniff" and "sandbox" in response["Content-Security-Policy"]
    client.force_login(outsider)
    assert client.get(f"/references/{sha}").status_code == 404


def test_editing_a_draft_removes_an_unticked_reference_and_adds_an_upload(signed_in, owner, project):
    old, kept = reference_store(owner, image(color=(1, 1, 1))), reference_store(owner, image(color=(2, 2, 2)))
    [job] = make_drafts(project, 1, references=[f"ref:{old}", f"ref:{kept}"])
    response = signed_in.post(
        f"/projects/{project.id}/drafts/{job.id}/edit",
        {"prompt": "edited", "model": "demo-image", "keep": [f"ref:{kept}"], "reference_files": [upload("n.gif", image("GIF"))]},
    )
    assert response.status_code == 302
    new = Reference.objects.get(content_type="image/gif").sha256
    assert Job.objects.get(id=job.id).references == [f"ref:{kept}", f"ref:{new}"]


# --- One validation for the page and the API ------------------------------------------------


def test_the_api_stores_a_data_uri_like_an_upload_and_refuses_what_the_page_refuses(client, owner, outsider, project):
    from queue_app.web import tokens

    _, raw = tokens.token_create(user=owner, name="t")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}

    def post(refs):
        return client.post(
            f"/api/projects/{project.id}/drafts", {"prompt": "p", "references": refs}, content_type="application/json", **auth
        )

    picture = image()
    response = post([data_uri(picture, claimed="image/gif"), "https://cdn.example.com/a.png"])
    assert response.status_code == 201
    sha = Reference.objects.get().sha256
    assert Job.objects.get().references == [f"ref:{sha}", "https://cdn.example.com/a.png"]
    theirs = AlbumItem.objects.create(
        project=make_project(outsider, None), owner=outsider, kind="image", file="album/t.png", content_type="image/png"
    )
    video = AlbumItem.objects.create(project=project, owner=owner, kind="video", file="album/v.mp4", content_type="video/mp4")
    for refs, says in [
        ([data_uri(HTML, claimed="image/png")], "HTML"),
        ([f"album:{theirs.id}"], "not an album item of this account"),
        ([f"album:{video.id}"], "is a video, not an image"),
        (["ref:" + "0" * 64], "no uploaded image"),
        (["file:///etc/passwd"], "must be ref:<sha256>, album:<id>, a data: URI or an http(s) URL"),
        (["https://x.example/a.png"] * (references.MAX_REFERENCES + 1), f"at most {references.MAX_REFERENCES}"),
        ("not a list", "references: Input should be a valid list"),
    ]:
        response = post(refs)
        assert response.status_code == 400 and says in response.json()["error"], (refs, response.json())
    assert Job.objects.count() == 1


# --- To the providers and ComfyUI -----------------------------------------------------------


def test_local_references_reach_the_adapter_as_data_uris_and_urls_stay(owner, project):
    picture = image()
    sha = reference_store(owner, picture)
    item = AlbumItem.objects.create(project=project, owner=owner, kind="image", content_type="image/png")
    item.file.save("a.png", ContentFile(picture))
    [job] = make_drafts(project, 1, references=[f"ref:{sha}", f"album:{item.id}", "https://cdn.example.com/a.png"])
    request = snapshot.resolved_job(job, project.provider, submit=True)
    assert request.references == [data_uri(picture), data_uri(picture), "https://cdn.example.com/a.png"]
    polled = snapshot.resolved_job(job, project.provider)
    assert polled.references == job.references  # a poll reads no files


def test_the_worker_sends_an_uploaded_reference_to_the_provider(owner, project, inline_tasks, monkeypatch):
    from queue_app.providers import demo

    sent = []
    real_submit = demo.submit
    monkeypatch.setattr(demo, "submit", lambda request: sent.append(request.references) or real_submit(request))
    picture = image()
    sha = reference_store(owner, picture)
    jobs_create_drafts(user=owner, project=project, prompt="x", settings_={"references": [f"ref:{sha}"]})
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    assert Job.objects.get().status == Status.COMPLETED
    assert sent == [[data_uri(picture)]]


@responses.activate
def test_openai_gets_the_uploaded_bytes_as_an_edit_and_replicate_gets_the_data_uri(owner, monkeypatch):
    use_fake_dns(monkeypatch)
    provider = make_provider(owner, name="OpenAI", family="openai")
    provider.api_key = "test-key-123456"
    provider.save()
    project = make_project(owner, provider, model="gpt-image-1.5")
    picture = image()
    sha = reference_store(owner, picture)
    [job] = make_drafts(project, 1, references=[f"ref:{sha}"])
    job.resolved = snapshot.build(job, project, provider)
    png_b64 = base64.b64encode(image(color=(0, 0, 0))).decode()
    responses.add(responses.POST, "https://api.openai.com/v1/images/edits", json={"created": 1, "data": [{"b64_json": png_b64}]})
    openai.submit(snapshot.resolved_job(job, provider, submit=True))
    assert picture in responses.calls[0].request.body
    responses.add(responses.POST, "https://api.replicate.com/v1/predictions", status=201, json={"id": "p1", "status": "starting"})
    request = snapshot.resolved_job(job, provider, submit=True)
    replicate.submit(
        type(request)(**{**request.__dict__, "family": "replicate", "model": "black-forest-labs/flux-2-pro", "api_key": "r8_x"})
    )
    body = json.loads(responses.calls[1].request.body)
    assert data_uri(picture) in json.dumps(body["input"])


def test_a_comfyui_image_binding_gets_the_uploaded_bytes_under_their_content_name(owner):
    from comfy_app import workflow

    picture = image()
    sha = reference_store(owner, picture)
    data, content_type, extension = workflow.load_reference(f"ref:{sha}", owner.id)
    assert (data, content_type, extension) == (picture, "image/png", ".png")
    graph = {"1": {"class_type": "LoadImage", "inputs": {"image": "default.png"}}}
    job = Job(owner=owner, prompt="x", references=[f"ref:{sha}"])
    uploaded = []
    built, _ = workflow.build(
        graph,
        [{"source": "references.0", "node": "1", "input": "image", "kind": "image"}],
        job,
        upload=lambda data, name, content_type: uploaded.append((data, name)) or f"rsq/{name}",
    )
    assert uploaded == [(picture, workflow.content_name(picture, ".png"))]
    assert built["1"]["inputs"]["image"] == f"rsq/{workflow.content_name(picture, '.png')}"
    with pytest.raises(workflow.WorkflowError, match="not an uploaded image of this account"):
        workflow.load_reference("ref:" + "f" * 64, owner.id)


def test_civitai_sends_every_reference_to_the_openai_engine_and_the_first_to_sdcpp():
    from queue_app.providers import civitai
    from tests.fakes.provider_shapes import resolved

    refs = [data_uri(image(color=(1, 1, 1))), data_uri(image(color=(2, 2, 2)))]
    step = civitai._step(resolved("civitai", model="gpt-image-1.5", params={"engine": "openai"}, references=refs))
    assert (step["input"]["operation"], step["input"]["images"]) == ("editImage", refs) and "image" not in step["input"]
    step = civitai._step(resolved("civitai", model="urn:air:sdxl:checkpoint:civitai:101055@128078", references=refs))
    assert (step["input"]["operation"], step["input"]["image"]) == ("createVariant", refs[0])


def test_a_form_without_a_prompt_stores_no_upload(signed_in, project):
    form = {"prompt": "  ", "quantity": "1", "reference_files": [upload("a.png", image())]}
    body = signed_in.post(f"/projects/{project.id}/drafts", form, HTTP_X_REQUESTED_WITH="fetch").json()
    assert body["messages"][0]["text"] == "a prompt is required"
    assert not Reference.objects.exists()


def test_staff_adding_to_a_users_project_stores_the_upload_as_the_owners(client, staff, owner, project):
    client.force_login(staff)
    form = {"prompt": "p", "quantity": "1", "reference_files": [upload("a.png", image())]}
    body = client.post(f"/projects/{project.id}/drafts", form, HTTP_X_REQUESTED_WITH="fetch").json()
    assert body["created"] == 1
    row = Reference.objects.get()
    assert row.owner_id == owner.id and Job.objects.get().references == [f"ref:{row.sha256}"]
    assert client.get(f"/references/{row.sha256}").status_code == 200
