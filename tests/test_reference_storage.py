"""Uploaded reference images count and are cleaned: a draft is validated before any of its
new images is stored, the images count against the owner's storage limit (the storage
summary, the start check and the output writer's quota alike), the API takes them as a
multipart upload up to the documented 20 MB and answers album-independent "ref:" ids,
and an upload no job names is deleted after the grace period by the queue service."""

import io
import json
import os
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from PIL import Image

from queue_app import limits
from queue_app.engine import outputs
from queue_app.models import AccountSettings, Job, Reference
from queue_app.queue_service.loop import QueueService
from queue_app.selectors.projects import storage_summary
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_start
from queue_app.services.storage import reference_store
from queue_app.web import tokens
from tests.engine_helpers import usage_and_limit
from tests.factories import make_drafts

pytestmark = pytest.mark.django_db


def image(color=(10, 120, 200), size=(6, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def noise_png(target_bytes: int) -> bytes:
    """A PNG of random pixels: it does not compress, so its size is about `target_bytes`."""
    side = int((target_bytes / 3) ** 0.5)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG", compress_level=0)
    return out.getvalue()


def upload(data: bytes, name="ref.png"):
    return SimpleUploadedFile(name, data, content_type="image/png")


def files_of(settings, user) -> list:
    folder = settings.MEDIA_ROOT / "references" / str(user.id)
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def api(owner):
    from django.test import Client

    raw = tokens.token_create(user=owner, name="refs")[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", raise_request_exception=False)


# --- validate first -------------------------------------------------------------------------


def test_a_refused_draft_form_stores_none_of_its_images(client, owner, project, settings):
    client.force_login(owner)
    refused = client.post(
        f"/projects/{project.id}/drafts", {"prompt": "a fox", "quantity": "0", "reference_files": upload(image())}
    )
    assert refused.status_code == 302 and not Job.objects.exists()
    assert not Reference.objects.exists() and files_of(settings, owner) == []
    many = "\n".join(f"line {n}" for n in range(limits.QUANTITY.high + 1))
    client.post(f"/projects/{project.id}/drafts", {"prompt": many, "per_line": "on", "reference_files": upload(image())})
    assert not Reference.objects.exists() and files_of(settings, owner) == []


def test_a_refused_draft_edit_stores_none_of_its_images(client, owner, project, settings):
    [draft] = make_drafts(project)
    client.force_login(owner)
    url = f"/projects/{project.id}/drafts/{draft.id}/edit"
    response = client.post(url, {"prompt": "bad \x00 prompt", "reference_files": upload(image())})
    assert response.status_code == 200 and b"NUL character" in response.content
    assert not Reference.objects.exists() and files_of(settings, owner) == []
    client.post(url, {"prompt": "a good prompt", "reference_files": upload(image())})
    assert Job.objects.get(id=draft.id).references == [f"ref:{Reference.objects.get().sha256}"]


def test_a_refused_api_draft_stores_none_of_its_data_uris(api, project, settings, owner):
    import base64

    uri = "data:image/png;base64," + base64.b64encode(image()).decode()
    body = {"prompt": "x", "references": [uri, "ftp://example.com/not-a-reference.png"]}
    response = api.post(f"/api/projects/{project.id}/drafts", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400 and "reference 2" in response.json()["error"]
    assert not Reference.objects.exists() and files_of(settings, owner) == []
    body = {"prompt": "\n".join(f"line {n}" for n in range(300)), "references": [uri], "quantity": 2, "per_line": True}
    response = api.post(f"/api/projects/{project.id}/drafts", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400 and not Reference.objects.exists()


# --- they count ------------------------------------------------------------------------------


def test_uploaded_references_count_in_the_storage_summary_and_every_quota(owner, project):
    AccountSettings.objects.filter(user=owner).update(storage_limit_bytes=60 * 1024 * 1024)
    sha = reference_store(owner, noise_png(20_000))
    size = Reference.objects.get(sha256=sha).size
    assert storage_summary(owner)["used_bytes"] == size and storage_summary(owner)["reference_bytes"] == size
    assert outputs.usage_bytes(owner.id) == size
    assert usage_and_limit(owner.id) == (size, 60 * 1024 * 1024)  # the output writer's read
    AccountSettings.objects.filter(user=owner).update(storage_limit_bytes=size + 25 * 1024 * 1024 - 1)
    make_drafts(project)
    with pytest.raises(ServiceError, match="Storage limit exceeded"):
        jobs_start(user=owner, project=project, all_drafts=True)  # the reference leaves no room for one job


def test_an_upload_over_the_storage_limit_is_refused_and_stores_nothing(api, owner, settings):
    AccountSettings.objects.filter(user=owner).update(storage_limit_bytes=10_000)
    response = api.post("/api/references", {"file": upload(noise_png(20_000))})
    assert response.status_code == 403 and "Storage limit exceeded" in response.json()["error"]
    assert not Reference.objects.exists() and files_of(settings, owner) == []


# --- the API's upload door ----------------------------------------------------------------


def test_the_api_takes_a_reference_up_to_the_documented_limit_and_drafts_name_it(api, project):
    big = noise_png(limits.REFERENCE_BYTES - 200_000)
    assert limits.REQUEST_BYTES < len(big) <= limits.REFERENCE_BYTES  # too big for a JSON body, not for an upload
    response = api.post("/api/references", {"file": upload(big)})
    assert response.status_code == 201, response.content[:300]
    answer = response.json()
    assert answer["reference"] == f"ref:{answer['sha256']}" and answer["size"] == len(big)
    assert api.post("/api/references", {"file": upload(big)}).status_code == 200  # stored once
    body = {"prompt": "x", "references": [answer["reference"]]}
    created = api.post(f"/api/projects/{project.id}/drafts", data=json.dumps(body), content_type="application/json")
    assert created.status_code == 201 and Job.objects.get().references == [answer["reference"]]


def test_the_api_upload_refuses_what_is_not_one_image_within_the_limit(api):
    too_big = upload(b"\x89PNG" + b"0" * limits.REFERENCE_BYTES)
    assert "a reference image may be 20 MB" in api.post("/api/references", {"file": too_big}).json()["error"]
    html = upload(b"<!doctype html><script>alert(1)</script>", name="x.png")
    assert "not an image" in api.post("/api/references", {"file": html}).json()["error"]
    two = api.post("/api/references", {"file": [upload(image()), upload(image((1, 2, 3)))]})
    assert two.status_code == 400 and "exactly one" in two.json()["error"]
    json_body = api.post("/api/references", data="{}", content_type="application/json")
    assert json_body.status_code == 415 and "multipart/form-data" in json_body.json()["error"]
    assert not Reference.objects.exists()


# --- they are cleaned -------------------------------------------------------------------------


def test_the_queue_service_removes_unused_uploads_after_the_grace_period(
    owner, project, settings, django_capture_on_commit_callbacks
):
    named, unused, recent = (reference_store(owner, image(color)) for color in ((1, 1, 1), (2, 2, 2), (3, 3, 3)))
    make_drafts(project, references=[f"ref:{named}"])
    old = timezone.now() - timedelta(seconds=limits.REFERENCE_GRACE_SECONDS + 60)
    Reference.objects.filter(sha256__in=[named, unused]).update(last_used_at=old)
    assert len(files_of(settings, owner)) == 3
    with django_capture_on_commit_callbacks(execute=True):
        assert QueueService().step_prune_references() is True
    assert set(Reference.objects.values_list("sha256", flat=True)) == {named, recent}
    assert len(files_of(settings, owner)) == 2
    assert Reference.objects.get(sha256=named).last_used_at > old  # looked at again a grace period later
    assert QueueService().step_prune_references() is False


def test_a_reference_named_again_is_not_removed_under_the_new_draft(owner, project):
    from queue_app.services.drafts import jobs_create_drafts
    from queue_app.services.storage import references_prune

    sha = reference_store(owner, image())
    old = timezone.now() - timedelta(seconds=limits.REFERENCE_GRACE_SECONDS + 60)
    Reference.objects.filter(sha256=sha).update(last_used_at=old)
    jobs_create_drafts(user=owner, project=project, prompt="x", settings_={"references": [f"ref:{sha}"]})
    Job.objects.all().delete()  # even with the draft gone again: it was used just now
    assert references_prune() == 0 and Reference.objects.filter(sha256=sha).exists()
