"""Double clicks in a real browser (Debian's Chromium) against daphne, at desktop and phone
sizes: with the pages' script the second press is dropped and the button is disabled; with
scripts off the browser sends the form twice and the form's one-time token answers the
second POST with the first one's result. Either way: one result."""

import pytest

from queue_app.models import Job, Project, Status
from tests import procs
from tests.conftest import make_project, make_provider

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SIZES = [pytest.param({"width": 1400, "height": 900}, id="desktop"), pytest.param({"width": 390, "height": 844}, id="phone")]


@pytest.fixture
def web(tmp_path):
    proc = procs.daphne(tmp_path / "logs", REDIS_URL="")
    yield proc
    proc.stop()


def signed_in_page(chromium, base, user, size, *, scripts=True):
    page = chromium.new_context(viewport=size, java_script_enabled=scripts).new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", "pw-" + user.username)
    page.click("main button[type=submit]")
    page.wait_for_url(f"{base}/projects/")
    return page


@pytest.mark.parametrize("size", SIZES)
def test_double_clicking_add_drafts_and_start_all_gives_one_result(web, chromium, owner, size):
    project = make_project(owner, make_provider(owner), name="Twice")
    page = signed_in_page(chromium, web.url, owner, size)
    page.goto(f"{web.url}/projects/{project.id}/")
    page.wait_for_selector("body[data-live='1']")
    page.fill("#draft-form textarea[name=prompt]", "a fox in the snow")
    page.dblclick("#draft-form button[type=submit]")
    page.wait_for_selector("#flash li:has-text('1 draft(s) created')")
    page.wait_for_function("document.querySelectorAll('#drafts tr[data-job]').length === 1")
    page.wait_for_function("!document.querySelector('#draft-form button[type=submit]').disabled")
    assert Job.objects.filter(project=project).count() == 1
    page.dblclick("#start-all")
    page.wait_for_selector("#flash li:has-text('1 job(s) started')")
    [status] = Job.objects.filter(project=project).values_list("status", flat=True)
    assert status != Status.DRAFT  # started once (a claim may have taken it already)


@pytest.mark.parametrize("size", SIZES)
def test_without_scripts_a_double_click_still_creates_one(web, chromium, owner, size):
    provider = make_provider(owner)
    page = signed_in_page(chromium, web.url, owner, size, scripts=False)
    page.goto(f"{web.url}/projects/new")
    page.fill("#id_name", "Twice")
    page.select_option("#id_kind", "image")
    page.select_option("#id_provider_id", str(provider.id))
    page.dblclick("#project-form button[type=submit]")
    page.wait_for_url(f"{web.url}/projects/*/")
    assert Project.objects.filter(owner=owner).count() == 1
    project = Project.objects.get(owner=owner)
    page.fill("#draft-form textarea[name=prompt]", "a hare")
    page.dblclick("#draft-form button[type=submit]")
    page.wait_for_selector(".messages li")
    procs.wait_for(lambda: Job.objects.filter(project=project).exists(), message="the draft")
    page.reload()  # a GET: the redirect after the POST means a reload sends nothing again
    assert Job.objects.filter(project=project).count() == 1
