"""The album (issue 12): the count says items and layers, tiles keep each image's shape,
an item can be deleted by its owner (confirmed; its file goes and its storage is freed),
and the project's album downloads as one zip that is streamed, never held in memory.
The lightbox in Chromium: previous / next, arrows and Esc, video and audio."""

import io
import os
import zipfile

import pytest
from django.core.files.base import ContentFile

from queue_app.engine import outputs
from queue_app.models import AlbumItem, Job, Status
from queue_app.web import album_zip
from tests import procs
from tests.conftest import CHROMIUM, make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def completed(project, inline_tasks, client, n=1, **fields):
    jobs = make_drafts(project, n, **fields)
    client.post(f"/projects/{project.id}/start", {"job": [str(j.id) for j in jobs]})
    inline_tasks.run()
    assert all(s == Status.COMPLETED for s in Job.objects.filter(id__in=[j.id for j in jobs]).values_list("status", flat=True))
    return jobs


def stored(project, data: bytes, *, kind="image", content_type="image/png", width=None, height=None, role="main"):
    [job] = make_drafts(project)
    Job.objects.filter(id=job.id).update(status=Status.COMPLETED)
    item = AlbumItem(project=project, owner=project.owner, job=job, kind=kind, content_type=content_type, size=len(data))
    item.role, item.width, item.height, item.prompt = role, width, height, job.prompt
    item.file.save(f"stored-{job.id}.bin", ContentFile(data), save=False)
    item.save()
    return item


def test_the_count_says_items_and_layers(signed_in, owner, inline_tasks):
    provider = make_provider(owner)
    layered = make_project(owner, provider, model="demo-layers")
    completed(layered, inline_tasks, signed_in, 2)
    response = signed_in.get(f"/projects/{layered.id}/?fragment=1")
    assert response.context["album_counts"] == {"items": 2, "layers": 6}
    assert '<span class="muted small" data-count="album">2 items, 6 layers</span>' in response.content.decode()
    [group, _] = response.context["album"]
    assert len(group["main"]) == 1 and len(group["layers"]) == 3  # layers grouped under their base image


def test_tiles_carry_each_images_own_shape(signed_in, project):
    wide = stored(project, b"x" * 10, width=1536, height=640)
    tall = stored(project, b"y" * 10, width=640, height=1536)
    html = signed_in.get(f"/projects/{project.id}/?fragment=1").content.decode()
    assert 'width="1536" height="640" style="aspect-ratio:1536/640"' in html
    assert 'width="640" height="1536" style="aspect-ratio:640/1536"' in html
    assert f'data-item="{wide.id}"' in html and f'data-item="{tall.id}"' in html


def test_the_owner_deletes_an_item_after_confirming_and_its_storage_is_freed(signed_in, owner, project, settings):
    keep = stored(project, b"k" * 3000)
    item = stored(project, b"d" * 5000)
    path = settings.MEDIA_ROOT / item.file.name
    assert path.exists() and outputs.usage_bytes(owner.id) == 8000
    page = signed_in.get(f"/album/{item.id}/delete")
    assert page.status_code == 200 and "<strong data-size>4.9 KB</strong>" in page.content.decode()  # what it frees
    assert signed_in.post(f"/album/{item.id}/delete").status_code == 200  # no confirm: asks again
    assert AlbumItem.objects.filter(id=item.id).exists()
    response = signed_in.post(f"/album/{item.id}/delete", {"confirm": "1"})
    assert response.status_code == 302 and response["Location"] == f"/projects/{project.id}/#album"
    said = [str(m) for m in signed_in.get(f"/projects/{project.id}/").context["messages"]]
    assert said == ["album item deleted; 4.9 KB freed"]  # the size the confirmation named, not "0.0 MB"
    assert not AlbumItem.objects.filter(id=item.id).exists() and not path.exists()
    assert outputs.usage_bytes(owner.id) == 3000 and AlbumItem.objects.filter(id=keep.id).exists()
    assert signed_in.get(f"/album/{item.id}/file").status_code == 404


def test_only_the_owner_deletes(client, outsider, staff, project, settings):
    item = stored(project, b"d" * 100)
    for user in (outsider, staff):  # staff may look at anyone's album, not delete from it
        client.force_login(user)
        assert client.post(f"/album/{item.id}/delete", {"confirm": "1"}).status_code == 404
    assert AlbumItem.objects.filter(id=item.id).exists() and (settings.MEDIA_ROOT / item.file.name).exists()


def test_the_album_downloads_as_one_zip_with_every_item(signed_in, owner, inline_tasks):
    provider = make_provider(owner)
    project = make_project(owner, provider, model="demo-layers")
    completed(project, inline_tasks, signed_in, 2)
    response = signed_in.get(f"/projects/{project.id}/album.zip")
    assert response.status_code == 200 and response.streaming and response["Content-Type"] == "application/zip"
    assert "attachment" in response["Content-Disposition"]
    archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
    assert archive.testzip() is None
    items = list(AlbumItem.objects.filter(project=project))
    assert len(archive.namelist()) == len(items) == 8
    for item in items:
        with item.file.open("rb") as f:
            assert archive.read(album_zip.entry_name(item)) == f.read()


def test_the_zip_is_streamed_in_chunks_never_the_whole_album(signed_in, project, monkeypatch):
    monkeypatch.setattr(album_zip, "CHUNK_BYTES", 4096)
    items = [stored(project, os.urandom(200_000)) for _ in range(3)]
    opened = []
    real_open = items[0].file.__class__.open
    monkeypatch.setattr(
        items[0].file.__class__, "open", lambda self, mode="rb": opened.append(self.name) or real_open(self, mode)
    )
    response = signed_in.get(f"/projects/{project.id}/album.zip")
    assert response.streaming
    stream = iter(response.streaming_content)
    first = next(stream)
    assert len(opened) == 1  # the first piece leaves before the second file is even opened
    chunks = [first, *stream]
    assert len(opened) == 3
    assert max(len(c) for c in chunks) <= 4096 + 200  # one read's worth (plus a header) at a time
    body = b"".join(chunks)
    assert len(body) > 600_000 and len(chunks) > 140
    assert (
        sorted(len(zipfile.ZipFile(io.BytesIO(body)).read(n)) for n in zipfile.ZipFile(io.BytesIO(body)).namelist())
        == [200_000] * 3
    )


def test_another_users_album_cannot_be_downloaded(client, outsider, project):
    stored(project, b"secret")
    client.force_login(outsider)
    assert client.get(f"/projects/{project.id}/album.zip").status_code == 404


# --- in Chromium ------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.processes
def test_the_lightbox_walks_the_album_with_buttons_and_keys_and_plays_video_and_audio(owner, project, tmp_path, settings):
    from playwright.sync_api import sync_playwright

    from tests.fakes.async_provider import png
    from tests.test_album_files import MP4, wav

    image = stored(project, png(), width=8, height=8)
    video = stored(project, MP4, kind="video", content_type="video/mp4")
    audio = stored(project, wav(), kind="audio", content_type="audio/wav")
    web = procs.daphne(tmp_path / "logs")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(20_000)
            page.goto(f"{web.url}/accounts/login/")
            page.fill("input[name=username]", owner.username)
            page.fill("input[name=password]", "pw-" + owner.username)
            page.click("main button[type=submit]")
            page.goto(f"{web.url}/projects/{project.id}/")
            order = page.eval_on_selector_all("a[data-lightbox]", "links => links.map(a => a.dataset.kind)")
            assert sorted(order) == ["audio", "image", "video"]
            page.click(f"a[data-item='{image.id}']")
            assert page.evaluate("document.getElementById('lightbox').open")
            seen = [page.get_attribute("#lb-stage > *", "data-kind")]
            page.click("#lb-next")
            seen.append(page.get_attribute("#lb-stage > *", "data-kind"))
            page.keyboard.press("ArrowRight")
            seen.append(page.get_attribute("#lb-stage > *", "data-kind"))
            assert sorted(seen) == ["audio", "image", "video"]  # every item once, whatever the order
            page.keyboard.press("ArrowRight")  # wraps around
            assert page.get_attribute("#lb-stage > *", "data-kind") == seen[0]
            page.keyboard.press("ArrowLeft")
            assert page.get_attribute("#lb-stage > *", "data-kind") == seen[2]
            tags = {"video": "VIDEO", "audio": "AUDIO", "image": "IMG"}
            assert page.evaluate("document.querySelector('#lb-stage > *').tagName") == tags[seen[2]]
            for kind in ("video", "audio"):
                page.click("#lb-next")
                while page.get_attribute("#lb-stage > *", "data-kind") != kind:
                    page.click("#lb-next")
                assert page.evaluate("document.querySelector('#lb-stage > *').tagName") == tags[kind]
                src = page.evaluate("document.querySelector('#lb-stage > *').getAttribute('src')")
                assert src == f"/album/{(video if kind == 'video' else audio).id}/file"
            page.keyboard.press("Escape")
            # the dialog's close event (which empties the stage) is dispatched after `open` turns
            # false, so wait for both: nothing keeps playing once it is closed
            page.wait_for_function(
                "!document.getElementById('lightbox').open && document.getElementById('lb-stage').children.length === 0"
            )
            # delete from the lightbox: through the confirmation, the tile goes
            page.click(f"a[data-item='{image.id}']")
            page.click("#lb-delete")
            page.click("#confirm-delete")
            page.wait_for_selector("text=album item deleted")
            assert page.locator(f"a[data-item='{image.id}']").count() == 0
            browser.close()
    finally:
        web.stop()
    assert not AlbumItem.objects.filter(id=image.id).exists()


async def test_under_asgi_the_zip_is_streamed_too_not_drained_into_a_list(async_client, owner, project, monkeypatch):
    """Django drains a sync iterator into a list under ASGI (daphne): the view hands it an
    async one, so the first piece still leaves before the last file is opened."""
    from asgiref.sync import sync_to_async

    monkeypatch.setattr(album_zip, "CHUNK_BYTES", 4096)
    items = await sync_to_async(lambda: [stored(project, os.urandom(100_000)) for _ in range(3)])()
    opened = []
    real_open = items[0].file.__class__.open
    monkeypatch.setattr(
        items[0].file.__class__, "open", lambda self, mode="rb": opened.append(self.name) or real_open(self, mode)
    )
    await async_client.aforce_login(owner)
    response = await async_client.get(f"/projects/{project.id}/album.zip")
    assert response.streaming and response.is_async
    stream = aiter(response.streaming_content)
    await anext(stream)
    assert len(opened) == 1
    chunks = [chunk async for chunk in stream]
    assert len(opened) == 3 and max(len(c) for c in chunks) <= 4096 + 200
