"""Album files are never a way to run script in someone's browser (issue 18 §1).

- an output's type is read from its bytes (Pillow, puremagic), never from the server's
  Content-Type: HTML, SVG and other non-media files fail their job with a readable reason,
  whatever header they came with; images, video, audio and text are kept;
- album files go out with nosniff, a sandboxing CSP, and as an attachment when their type
  is not one of the album's media types (rows stored before the check included);
- in Chromium: a hostile output — HTML, SVG with script, a PNG/HTML polyglot, and rows of
  those types stored before the check — never runs script when opened from the album, the
  job page or the monitor.
"""

import io
import wave

import pytest
from django.core.files.base import ContentFile
from django.test import Client

from queue_app.engine import media
from queue_app.models import AlbumItem, Job, Status
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider
from tests.fakes.async_provider import FakeAsyncProvider, png

SCRIPT = b"document.title='PWNED';alert('PWNED')"
HTML = b"<!doctype html><html><head><title>album</title></head><body><script>" + SCRIPT + b"</script></body></html>"
SVG = (
    b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="40" height="40">'
    b'<rect width="40" height="40" fill="red"/><script>' + SCRIPT + b"</script></svg>"
)
# A valid PNG that is also an HTML page: Pillow reads it, a sniffing browser could render it.
POLYGLOT = png() + b"<html><body><script>" + SCRIPT + b"</script></body></html>"
# Starts like a GIF, is a script: no image decoder reads it.
GIF_SCRIPT = b"GIF89a=1;" + SCRIPT + b";//"


def wav() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(8000), out.writeframes(b"\0\0" * 800)
    return buffer.getvalue()


MP4 = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\0" * 64


# --- the type comes from the bytes ------------------------------------------------------


@pytest.mark.parametrize(
    "data, expected",
    [(png(), "image/png"), (POLYGLOT, "image/png"), (wav(), "audio/wav"), (MP4, "video/mp4")],
    ids=["png", "png-html-polyglot", "wav", "mp4"],
)
def test_media_is_known_by_its_bytes(data, expected):
    assert media.sniff(data) == expected


@pytest.mark.parametrize(
    "data, says",
    [
        (HTML, "HTML"),
        (SVG, "SVG"),
        (GIF_SCRIPT, "not one the album shows"),
        (b"%PDF-1.4\n%\xe2\xe3\n1 0 obj<</Type/Catalog>>endobj", "PDF"),
        (b"\x7fELF\x02\x01\x01" + b"\0" * 60, "not one the album shows"),
        (b"<script>" + SCRIPT + b"</script>", "markup"),
        (b"", "empty"),
    ],
    ids=["html", "svg", "gif-header-script", "pdf", "elf", "bare-script", "empty"],
)
def test_anything_else_is_refused_with_a_readable_reason(data, says):
    with pytest.raises(media.NotMedia) as refused:
        media.sniff(data)
    assert says in str(refused.value)


def test_text_is_kept_as_text_only_when_the_output_is_text():
    assert media.sniff("a haiku about herons, Vänern".encode(), text_allowed=True) == "text/plain"
    with pytest.raises(media.NotMedia):
        media.sniff(b"a haiku about herons")
    with pytest.raises(media.NotMedia):  # an HTML page is not text, even for a text output
        media.sniff(HTML, text_allowed=True)


def test_a_poster_that_is_not_an_image_is_dropped_and_a_png_poster_becomes_jpeg():
    assert media.jpeg_poster(HTML) is None
    assert media.jpeg_poster(png())[:3] == b"\xff\xd8\xff"


# --- end to end: a provider server that lies about its files ------------------------------


def hostile_provider(owner, fake, name="Hostile"):
    provider = make_provider(owner, name=name, family="runninghub", concurrency=2)
    provider.api_key = "rh-test-key-123"
    provider.base_url = f"{fake.url}/openapi/v2"
    provider.save()
    project = make_project(owner, provider, name=name, model="workflow-layers")
    [job] = make_drafts(project, params={"workflow_id": "1987", "prompt_node": {"nodeId": "6", "fieldName": "text"}})
    return project, job


def run_with(owner, inline_tasks, settings, file, name="Hostile"):
    with FakeAsyncProvider(file=file, immediate=True) as fake:
        settings.OUTBOUND_ALLOWLIST = [fake.host]
        settings.OUTBOUND_ALLOW_HTTP = True
        project, job = hostile_provider(owner, fake, name)
        jobs_start(user=owner, project=project, all_drafts=True)
        inline_tasks.run()
    job.refresh_from_db()
    return project, job


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "file, says",
    [((HTML, "image/png"), "HTML"), ((HTML, "text/html"), "HTML"), ((SVG, "image/svg+xml"), "SVG"), ((SVG, "image/png"), "SVG")],
    ids=["html-as-png", "html", "svg", "svg-as-png"],
)
def test_a_hostile_file_fails_its_job_and_reaches_no_album(owner, inline_tasks, settings, file, says):
    _, job = run_with(owner, inline_tasks, settings, file)
    assert job.status == Status.FAILED, job.error
    assert "not a media file the album can show" in job.error and says in job.error
    assert not AlbumItem.objects.filter(job=job).exists()
    assert not list((settings.MEDIA_ROOT / "album").rglob("*")) if (settings.MEDIA_ROOT / "album").exists() else True


@pytest.mark.django_db(transaction=True)
def test_a_real_image_under_a_lying_header_is_stored_as_what_it_is(owner, inline_tasks, settings):
    _, job = run_with(owner, inline_tasks, settings, (png(), "text/html"))
    assert job.status == Status.COMPLETED, job.error
    item = AlbumItem.objects.get(job=job)
    assert item.content_type == "image/png" and item.kind == "image" and item.file.name.endswith(".png")


# --- images with huge dimensions -----------------------------------------------------------


def png_claiming(width: int, height: int, *, mode: str = "1") -> bytes:
    """A real PNG of `width` × `height` pixels: one bit each, all black, so a few KB on disk
    for what decodes to hundreds of MB."""
    import zlib

    from PIL import Image

    image = Image.new(mode, (width, height))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=9)
    del image
    data = buffer.getvalue()
    assert len(data) < 200_000 and zlib  # tiny on disk
    return data


@pytest.fixture(scope="module")
def huge_png():
    return png_claiming(13000, 13000)


def test_an_image_over_the_pixel_bound_is_refused_from_its_header(huge_png):
    from queue_app import limits

    with pytest.raises(media.NotMedia) as refused:
        media.sniff(huge_png)
    assert "13000 × 13000 pixels" in str(refused.value)
    assert media.image_header(png_claiming(64, 64)) == ("image/png", 64, 64)
    side = int(limits.IMAGE_PIXELS**0.5)
    assert media.image_header(png_claiming(side, side))[1:] == (side, side)  # the bound itself is allowed


def test_a_huge_poster_is_dropped_without_decoding_it(huge_png, monkeypatch):
    from PIL import Image

    decoded = []

    def never(*args, **kwargs):
        decoded.append(True)
        raise MemoryError("13000 × 13000 pixels, decoded")

    monkeypatch.setattr(Image.Image, "load", never)
    assert media.jpeg_poster(huge_png) is None
    assert decoded == []


@pytest.mark.django_db(transaction=True)
def test_a_huge_image_output_fails_its_job_with_the_reason(owner, inline_tasks, settings, huge_png):
    _, job = run_with(owner, inline_tasks, settings, (huge_png, "image/png"))
    assert job.status == Status.FAILED and "13000 × 13000 pixels" in job.error, job.error
    assert not AlbumItem.objects.filter(job=job).exists()


@pytest.mark.django_db
def test_a_huge_reference_image_is_refused_with_the_reason(owner, project, huge_png):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from queue_app.models import Reference

    client = Client()
    client.force_login(owner)
    upload = SimpleUploadedFile("huge.png", huge_png, content_type="image/png")
    response = client.post(f"/projects/{project.id}/drafts", {"prompt": "a fox", "reference_files": upload}, follow=True)
    assert "13000 × 13000 pixels" in response.content.decode()
    assert not Reference.objects.exists() and not Job.objects.filter(project=project).exists()


# --- how files are served ------------------------------------------------------------------


def stored_item(project, job, data, content_type, *, kind="image", index=0):
    """An album row as an older version could have stored it (no type check)."""
    item = AlbumItem(
        project=project, owner=project.owner, job=job, output_index=index, kind=kind, content_type=content_type, size=len(data)
    )
    item.file.save(f"legacy-{job.id}-{index}.bin", ContentFile(data), save=False)
    item.save()
    return item


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "data, content_type, inline",
    [(png(), "image/png", True), (HTML, "text/html", False), (SVG, "image/svg+xml", False), (HTML, "", False)],
    ids=["png", "html", "svg", "no-type"],
)
def test_album_files_are_served_sandboxed_and_unknown_types_as_attachments(owner, project, data, content_type, inline):
    [job] = make_drafts(project)
    item = stored_item(project, job, data, content_type)
    client = Client()
    client.force_login(owner)
    response = client.get(f"/album/{item.id}/file")
    assert response.status_code == 200
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Security-Policy"].startswith("sandbox; default-src 'none'")
    if inline:
        assert response["Content-Type"] == content_type and "Content-Disposition" not in response
    else:
        assert response["Content-Type"] == "application/octet-stream"
        assert response["Content-Disposition"].startswith("attachment")


@pytest.mark.django_db(transaction=True)
def test_text_items_are_plain_text_in_a_sandbox(owner, project):
    [job] = make_drafts(project)
    item = AlbumItem.objects.create(
        project=project, owner=owner, job=job, output_index=0, kind="text", text=HTML.decode(), content_type="text/plain"
    )
    client = Client()
    client.force_login(owner)
    response = client.get(f"/album/{item.id}/file")
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff" and "sandbox" in response["Content-Security-Policy"]


# --- in a real browser ----------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_no_hostile_output_runs_script_from_the_album_the_job_page_or_the_monitor(
    owner, inline_tasks, settings, tmp_path, chromium
):
    from playwright.sync_api import Error as PlaywrightError

    # Through the fake provider: what the output writer makes of each hostile file.
    html_project, html_job = run_with(owner, inline_tasks, settings, (HTML, "text/html"), "HTML")
    _, svg_job = run_with(owner, inline_tasks, settings, (SVG, "image/svg+xml"), "SVG")
    poly_project, poly_job = run_with(owner, inline_tasks, settings, (POLYGLOT, "text/html"), "Polyglot")
    assert (html_job.status, svg_job.status, poly_job.status) == (Status.FAILED, Status.FAILED, Status.COMPLETED)
    # And rows stored before the check, with the types their servers announced.
    [legacy_html, legacy_svg, legacy_poly] = make_drafts(poly_project, 3)
    Job.objects.filter(id__in=[legacy_html.id, legacy_svg.id, legacy_poly.id]).update(status=Status.COMPLETED)
    stored_item(poly_project, legacy_html, HTML, "text/html")
    stored_item(poly_project, legacy_svg, SVG, "image/svg+xml")
    stored_item(poly_project, legacy_poly, POLYGLOT, "text/html")

    web = procs.daphne(tmp_path / "logs")
    dialogs = []
    try:
        context = chromium.new_context(accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{web.url}/accounts/login/")
        page.fill("input[name=username]", owner.username)
        page.fill("input[name=password]", "pw-" + owner.username)
        page.click("main button[type=submit]")
        page.wait_for_url(f"{web.url}/projects/")

        opened = []
        for path in (f"/projects/{poly_project.id}/", f"/projects/{html_project.id}/", f"/jobs/{html_job.id}/", "/queue/"):
            page.goto(web.url + path)
            page.wait_for_load_state("networkidle")
            assert page.title() != "PWNED", path
            # every album item's own link (not the album page's nor its filters)
            items = "links => links.map(a => a.href).filter(href => /[/]album[/][0-9]+[/]/.test(new URL(href).pathname))"
            links = page.eval_on_selector_all("a[href*='/album/']", items)
            for link in dict.fromkeys(links):
                try:
                    page.goto(link)
                    page.wait_for_timeout(300)
                    title = page.title()
                except PlaywrightError:  # an attachment: the browser downloads it, renders nothing
                    title = ""
                opened.append(link)
                assert title != "PWNED", link
    finally:
        web.stop()
    assert len(opened) == 4  # the polyglot and the three stored rows, each opened from the album
    assert dialogs == []
