"""Every number on a live page follows what it describes, without a reload, in the
embedded set-up (no Redis: daphne relays what other processes wrote) and with Redis, at
desktop and phone sizes: a ComfyUI job's progress bar moves as the queue service writes
it, an instance outage appears and clears on the open project and job pages, and after
Start all the storage lines and the quantity's maximum say what is left."""

import uuid

import pytest
from django.conf import settings
from django.utils import timezone

from comfy_app.models import ComfyInstance
from comfy_app.runner.instance import mark_reachable, mark_unreachable
from queue_app.models import AccountSettings, Job, Provider, Status
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider
from tests.test_double_click_browser import signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SETUPS = [pytest.param("embedded", id="embedded"), pytest.param("redis", id="redis", marks=pytest.mark.redis)]
SIZES = [pytest.param({"width": 1400, "height": 900}, id="desktop"), pytest.param({"width": 390, "height": 844}, id="phone")]
MB = 1024 * 1024


@pytest.fixture
def web(request, tmp_path):
    proc = procs.daphne(tmp_path / "logs", REDIS_URL="" if request.param == "embedded" else settings.REDIS_URL)
    yield proc
    proc.stop()


def running_comfy_job(owner):
    """A ComfyUI project whose one job is at its instance (as the queue service left it)."""
    project = make_project(owner, None, kind="comfyui", name="Comfy")
    instance = ComfyInstance.objects.create(project=project, base_url="http://127.0.0.1:9", workflow={})
    [job] = make_drafts(project, 1)
    Job.objects.filter(id=job.id).update(
        status=Status.PROCESSING, task_id="prompt-1", lease_token=uuid.uuid4(), started_at=timezone.now(), attempts=1
    )
    return project, instance, job


def bar_width(page, job) -> str:
    return page.eval_on_selector(f'[data-job="{job.id}"] .progress > i', "i => i.style.width")


@pytest.mark.parametrize("web", SETUPS, indirect=True)
@pytest.mark.parametrize("size", SIZES)
def test_comfyui_progress_and_an_outage_reach_open_pages_without_a_reload(web, chromium, owner, size):
    project, instance, job = running_comfy_job(owner)
    project_page = signed_in_page(chromium, web.url, owner, size)
    project_page.goto(f"{web.url}/projects/{project.id}/")
    job_page = project_page.context.new_page()
    job_page.goto(f"{web.url}/jobs/{job.id}/")
    for page in (project_page, job_page):
        page.wait_for_selector("body[data-live='1']")
        page.evaluate("window.__sameDocument = 'yes'")
    for fraction, width in ((0.5, "50%"), (0.88, "88%")):
        Job.objects.filter(id=job.id).update(progress=fraction)  # as the queue service writes it
        for page in (project_page, job_page):
            procs.wait_for(lambda p=page, w=width: bar_width(p, job) == w, timeout=20, message=f"the bar at {width}")
    mark_unreachable(instance.id, "Cannot reach ComfyUI at http://127.0.0.1:9 (connection refused)", timezone.now())
    project_page.wait_for_selector("#instance-warning")
    job_page.wait_for_selector("main :text('instance unreachable since')")
    mark_reachable(ComfyInstance.objects.get(id=instance.id), timezone.now())
    project_page.wait_for_selector("#instance-warning", state="detached")
    job_page.wait_for_selector("main :text('instance unreachable since')", state="detached")
    assert [page.evaluate("window.__sameDocument") for page in (project_page, job_page)] == ["yes", "yes"]


@pytest.mark.parametrize("web", SETUPS[:1], indirect=True)
@pytest.mark.parametrize("size", SIZES)
def test_the_storage_lines_and_the_quantity_maximum_follow_start_all(web, chromium, owner, size):
    AccountSettings.objects.filter(user=owner).update(storage_limit_bytes=100 * MB)  # four jobs' reserve
    provider = make_provider(owner)
    Provider.objects.filter(id=provider.id).update(paused=True)  # started jobs stay pending, holding their reserve
    project = make_project(owner, provider, name="Storage")
    make_drafts(project, 3)
    page = signed_in_page(chromium, web.url, owner, size)
    page.goto(f"{web.url}/projects/{project.id}/")
    page.wait_for_selector("body[data-live='1']")
    page.evaluate("window.__sameDocument = 'yes'")
    assert "Starting all 3 drafts would reserve 75 MB" in page.inner_text("#storage-start")
    assert page.get_attribute("#draft-form input[name=quantity]", "max") == "4"
    page.click("#start-all")
    page.wait_for_function("!document.getElementById('storage-start').textContent.includes('Starting all')")
    page.wait_for_selector("#storage-usage :text('reserved by 3 pending jobs')")
    assert page.get_attribute("#draft-form input[name=quantity]", "max") == "1"
    assert page.evaluate("window.__sameDocument") == "yes"
