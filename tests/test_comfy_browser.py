"""In a real browser (Chromium through Playwright) against daphne: a ComfyUI project set up
as a new user would — a local instance allowed by staff in the app, the workflow uploaded
as the exported .json, an input bound with the picker, the connection tested without
losing the form."""

import json

import pytest

from comfy_app.models import ComfyAllowedHost, ComfyInstance
from tests import procs
from tests.conftest import make_project
from tests.fakes.comfyui import WORKFLOW, FakeComfyUI
from tests.test_browser import browser_page as browser_page  # noqa: F401  (the fixture)
from tests.test_browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def web(tmp_path, settings):
    settings.OUTBOUND_ALLOWLIST = []  # no environment allowlist: staff allow the host in the app
    proc = procs.daphne(tmp_path / "logs", REDIS_URL="")
    yield proc
    proc.stop()


def test_a_comfyui_project_is_set_up_from_an_uploaded_workflow_with_the_picker_and_a_staff_allowed_local_host(
    web, browser_page, staff, tmp_path
):
    page, base = browser_page, web.url
    fake = FakeComfyUI().start()
    try:
        project = make_project(staff, None, kind="comfyui", name="Local ComfyUI")
        exported = tmp_path / "workflow_api.json"
        exported.write_text(json.dumps(WORKFLOW))
        log_in(page, base, staff)
        page.goto(f"{base}/projects/{project.id}/")
        page.click("#comfy-settings-link")
        page.wait_for_url(f"{base}/projects/{project.id}/comfyui/")
        page.fill("input[name=base_url]", fake.url)
        page.set_input_files("input[name=workflow_file]", str(exported))
        page.click("button[value=save]")
        assert "must first be allowed by staff" in page.inner_text("main")  # refused, and told where
        assert json.loads(page.input_value("textarea[name=workflow]")) == WORKFLOW  # the upload is kept
        assert page.eval_on_selector("textarea[name=workflow]", "t => t.getBoundingClientRect().width") > 600  # styled
        page.click("#nav-allowed-hosts")  # where the refusal said, in the navigation
        page.wait_for_url(f"{base}/comfy/allowed-hosts/")
        page.fill("#allow-host input[name=address]", f"127.0.0.1:{fake.port}")
        page.click("#allow-host button[type=submit]")
        page.wait_for_selector(f'tr[data-host="127.0.0.1:{fake.port}"]')
        page.goto(f"{base}/projects/{project.id}/comfyui/")
        page.fill("input[name=base_url]", fake.url)
        page.set_input_files("input[name=workflow_file]", str(exported))
        page.click("button[value=save]")
        page.wait_for_selector("#bindings-picker")
        page.select_option('select[name="bind:1:width"]', "width")
        page.click("#test-connection")
        page.wait_for_selector("#test-result[data-ok=yes]")
        assert page.input_value('select[name="bind:1:width"]') == "width"  # the form survived the test
        sent = []
        page.on("request", lambda request: sent.append(request.method))
        page.reload()  # the test was asked in the background: a reload sends nothing again
        assert "POST" not in sent
        page.select_option('select[name="bind:1:width"]', "width")  # the saved workflow's picker, chosen again
        page.click("button[value=save]")
        page.wait_for_selector('select[name="bind:1:width"] option[value=width][selected]', state="attached")
    finally:
        fake.stop()
    instance = ComfyInstance.objects.get(project=project)
    assert instance.base_url == fake.url and instance.workflow == WORKFLOW
    assert instance.bindings == [{"source": "params.width", "node": "1", "input": "width", "kind": "number"}]
    assert ComfyAllowedHost.objects.get().created_by == staff
