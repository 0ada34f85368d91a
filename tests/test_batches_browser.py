"""Batches in a real browser (issue 29), at desktop and phone sizes: a workflow of two
prompt parts × two references × two aspect ratios previews "8 combinations", ten drafts
repeat the first two; one prompt fans out to two providers and both show in the compare
view; an album item's configuration is reused from its job page."""

import pytest

from queue_app.models import AlbumItem, Job, Status
from tests import procs
from tests.conftest import make_job, make_project, make_provider
from tests.test_double_click_browser import SIZES, signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

WORKFLOW = """prompt: a fox
prompt: an owl
reference: https://example.com/a.png
reference: https://example.com/b.png
aspect_ratio: 1:1
aspect_ratio: 16:9"""


@pytest.fixture
def web(tmp_path):
    proc = procs.daphne(tmp_path / "logs", REDIS_URL="")
    yield proc
    proc.stop()


@pytest.mark.parametrize("size", SIZES)
def test_combinations_fan_out_compare_and_reuse(web, chromium, owner, size):
    first, second = make_provider(owner, name="Demo A"), make_provider(owner, name="Demo B")
    project = make_project(owner, first, name="Batches")
    page = signed_in_page(chromium, web.url, owner, size)
    page.goto(f"{web.url}/projects/{project.id}/")
    page.click("#generate-link")
    page.fill("#generate-form textarea[name=workflow]", WORKFLOW)
    page.fill("#generate-form input[name=quantity]", "10")
    page.click("#preview-button")
    page.wait_for_selector("#combination-count:has-text('8 combinations')")
    assert "10 drafts (2 repeats)" in page.inner_text("#combination-count")
    rows = page.eval_on_selector_all(
        "#previews tr", "rows => rows.slice(1).map(r => [...r.cells].slice(1).map(c => c.textContent.trim()).join(' | '))"
    )
    assert rows[8:] == rows[:2] and len(set(rows)) == 8
    assert rows[0].startswith("a fox") and "a.png" in rows[0] and "1:1" in rows[0] and "16:9" in rows[1]
    page.click("#create-button")
    page.wait_for_url(f"{web.url}/projects/{project.id}/")
    assert Job.objects.filter(project=project, status=Status.DRAFT).count() == 10

    page.goto(f"{web.url}/projects/{project.id}/generate")
    page.fill("#generate-form textarea[name=workflow]", f"prompt: a heron\nprovider: {first.id}\nprovider: {second.id}")
    page.fill("#generate-form input[name=quantity]", "")
    page.click("#create-button")
    page.wait_for_url(f"{web.url}/projects/{project.id}/")
    herons = Job.objects.filter(project=project, prompt="a heron")
    assert sorted(job.provider_id for job in herons) == [first.id, second.id]
    for job in herons:  # what the workers would have stored
        AlbumItem.objects.create(
            project=project, owner=owner, job=job, kind="text", text=f"by {job.provider.name}", prompt=job.prompt
        )
    page.click("#compare-link")
    page.wait_for_selector("#compare th.column:has-text('Demo B')", state="attached")  # a phone shows cards
    heron_row = page.eval_on_selector("#compare tr:has-text('a heron')", "row => row.textContent")
    assert heron_row.index("by Demo A") < heron_row.index("by Demo B")

    done = make_job(project, Status.COMPLETED, prompt="a crane", aspect_ratio="16:9", quality="high")
    AlbumItem.objects.create(project=project, owner=owner, job=done, kind="text", text="crane", prompt="a crane")
    page.goto(f"{web.url}/album/?q=crane")
    page.click("#album-browse a:has-text('job, reuse')")
    page.fill("#reuse-form input[name=prompt]", "{prompt} at dawn")
    page.click("#reuse-form button[type=submit]")
    page.wait_for_url(f"{web.url}/projects/{project.id}/*")
    reused = Job.objects.get(project=project, prompt="a crane at dawn")
    assert (reused.status, reused.aspect_ratio, reused.quality) == (Status.DRAFT, "16:9", "high")
