"""Every page on a phone (issue 12): at 390×844 no page scrolls sideways — the monitor,
the project list and page (with its album), the job page, the providers and the account
— with seeded data (long prompts and errors, layers, a detached job); and the same pages
at 1400×900. Screenshots are kept as artefacts under var/screenshots/."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from queue_app.models import AlbumItem, Job, Status
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import CHROMIUM, make_drafts, make_project, make_provider

SCREENSHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"
LONG = "a very long prompt about a fox in the snow at dawn, " * 6 + "Supercalifragilisticexpialidocious" * 3

# Each album image as drawn against the image itself: (drawn width / height, natural width / height).
SHAPES = """() => [...document.querySelectorAll('#album a.lb img')].filter((img) => img.complete && img.naturalHeight)
  .map((img) => [img.clientWidth / img.clientHeight, img.naturalWidth / img.naturalHeight])"""

# What sticks out past the right edge, for the failure message.
OVERFLOW = """(width) => [...document.querySelectorAll('body *')]
  .filter((el) => el.getBoundingClientRect().right > width + 1 || el.scrollWidth > el.clientWidth + 1)
  .slice(-6).map((el) => `${el.tagName.toLowerCase()}#${el.id}.${el.className} ${Math.round(el.getBoundingClientRect().right)}`)
"""


@pytest.fixture
def seeded(owner, inline_tasks):
    """A provider with a long name, a project with drafts, queued, failed and detached
    jobs, and an album with layers."""
    provider = make_provider(owner, name="Demo provider with a rather long name", concurrency=2)
    project = make_project(owner, provider, name="Phone check " + "long-name-" * 4, model="demo-layers")
    done = make_drafts(project, 2, prompt=LONG)
    jobs_start(user=owner, project=project, job_ids=[j.id for j in done])
    inline_tasks.run()
    assert AlbumItem.objects.filter(project=project).count() == 8
    make_drafts(project, 3, prompt=LONG)
    failed, pending = make_drafts(project, 2, prompt=LONG)
    Job.objects.filter(id=failed.id).update(status=Status.FAILED, error="provider said: " + "x" * 300, error_class="permanent")
    Job.objects.filter(id=pending.id).update(status=Status.PENDING)
    remote = make_provider(owner, name="Async", mode="async", latency_ms=600_000)
    detached_project = make_project(owner, remote, name="Detached")
    [detached] = make_drafts(detached_project, prompt=LONG)
    jobs_start(user=owner, project=detached_project, job_ids=[detached.id])
    inline_tasks.run()
    assert Job.objects.get(id=detached.id).task_id
    return {
        "monitor": "/queue/",
        "projects": "/projects/",
        "project": f"/projects/{project.id}/",
        "album": f"/projects/{project.id}/#album",
        "job": f"/jobs/{done[0].id}/",
        "failed-job": f"/jobs/{failed.id}/",
        "detached-job": f"/jobs/{detached.id}/",
        "providers": "/providers/",
        "provider": f"/providers/{provider.id}/",
        "account": "/account/",
    }


@pytest.fixture
def site(owner, tmp_path):
    """Chromium and daphne against the test database: (browser, base URL)."""
    from playwright.sync_api import sync_playwright

    web = procs.daphne(tmp_path / "logs")
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            yield chromium, web.url
            chromium.close()
    finally:
        web.stop()


def log_in(page, base, user):
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", "pw-" + user.username)
    page.click("main button[type=submit]")
    page.wait_for_url(f"{base}/projects/")


def walk(site, owner, pages: dict, *, width: int, height: int, mobile: bool) -> tuple[dict, list]:
    """Each page's scroll width (with what sticks out when too wide), and the album's image shapes."""
    chromium, base = site
    context = chromium.new_context(viewport={"width": width, "height": height}, is_mobile=mobile, has_touch=mobile)
    page = context.new_page()
    page.set_default_timeout(20_000)
    log_in(page, base, owner)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    widths, shapes = {}, []
    for name, path in pages.items():
        page.goto(base + path)
        page.wait_for_load_state("networkidle")
        widths[name] = page.evaluate("document.scrollingElement.scrollWidth")
        if name == "album":
            # lazy images start loading once laid out in view: wait for them, not for network idle
            page.wait_for_function("[...document.querySelectorAll('#album a.lb img')].every((img) => img.complete)")
            shapes = page.evaluate(SHAPES)
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}x{height}.png"), full_page=True)
        if widths[name] > width:
            widths[name] = (widths[name], page.evaluate(OVERFLOW, width))
    context.close()
    return widths, shapes


@pytest.mark.browser
@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_every_page_fits_a_phone_without_sideways_scrolling(site, owner, seeded):
    widths, shapes = walk(site, owner, seeded, width=390, height=844, mobile=True)
    too_wide = {name: w for name, w in widths.items() if not isinstance(w, int) or w > 390}
    assert not too_wide, too_wide
    assert (SCREENSHOTS / "album-390x844.png").exists()
    assert len(shapes) == 8  # two composites and their six layers: none squashed into a box
    assert all(abs(drawn - natural) / natural < 0.05 for drawn, natural in shapes), shapes


@pytest.mark.browser
@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_every_page_fits_a_laptop(site, owner, seeded):
    widths, shapes = walk(site, owner, seeded, width=1400, height=900, mobile=False)
    too_wide = {name: w for name, w in widths.items() if not isinstance(w, int) or w > 1400}
    assert not too_wide, too_wide
    assert len(shapes) == 8 and all(abs(drawn - natural) / natural < 0.05 for drawn, natural in shapes), shapes


# --- `make test` brings the browser tests, never skips them --------------------------------


def run_laptop_test_without_chromium(tmp_path, **env) -> subprocess.CompletedProcess:
    # A pytest of its own, on a SQLite test database of its own: never the one this run uses.
    dropped = ("REQUIRE_BROWSER", "DATABASE_URL", "REDIS_URL", "TEST_DB_NAME")
    environment = {key: value for key, value in os.environ.items() if key not in dropped}
    environment.update(CHROMIUM_PATH="/nonexistent/chromium", TEST_DB_NAME=str(tmp_path / "sub.sqlite3"), **env)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", f"{__file__}::test_every_page_fits_a_laptop"]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=240, cwd=settings.BASE_DIR)


@pytest.mark.processes
def test_under_make_test_a_missing_chromium_fails_the_browser_tests_saying_how(tmp_path):
    result = run_laptop_test_without_chromium(tmp_path, REQUIRE_BROWSER="1")
    assert result.returncode == 1, result.stdout[-2000:]
    assert "1 error" in result.stdout and "sudo apt-get install chromium" in result.stdout  # fails at setup, saying how


@pytest.mark.processes
def test_outside_make_test_a_missing_chromium_skips_the_browser_tests(tmp_path):
    result = run_laptop_test_without_chromium(tmp_path)
    assert result.returncode == 0 and "1 skipped" in result.stdout, result.stdout[-2000:]


def test_the_makefile_test_target_brings_chromium_and_requires_it():
    makefile = (Path(settings.BASE_DIR) / "Makefile").read_text()
    assert "test: $(DEV_STAMP) chromium\n\tREQUIRE_BROWSER=1 " in makefile
    result = subprocess.run(
        ["make", "-s", "-n", "chromium", "CHROMIUM=/nonexistent/chromium"], capture_output=True, text=True, cwd=settings.BASE_DIR
    )
    assert "apt-get install -y -qq chromium" in result.stdout and "sudo apt-get install chromium" in result.stdout
