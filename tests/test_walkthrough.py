"""Issue 12's walk: an ordinary, non-staff user through the real UI in Debian's Chromium,
against daphne with the workers and the queue service in their own processes, at a laptop's
1400x900 and a phone's 390x844. Provider (and its Test key), project, drafts from a
multi-line prompt with a reference image, edit one, start, cancel a running job and a
detached one (the fake provider sees the remote cancel), retry, job page, lightbox, album
zip, delete. Screenshots of every step stay in var/screenshots/walkthrough/; at 390 px no
page visited scrolls sideways."""

import io
import os
import zipfile

import pytest
from django.conf import settings

from queue_app.models import AlbumItem, Job, Project, Status
from tests import procs
from tests.factories import make_drafts, make_project, make_provider
from tests.fakes.async_provider import FakeAsyncProvider, png
from tests.test_browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SHOTS = settings.BASE_DIR / "var" / "screenshots" / "walkthrough"
WIDER_THAN_VIEWPORT = "document.documentElement.scrollWidth - window.innerWidth"


@pytest.fixture
def fake_remote():
    """A RunningHub-shaped provider on loopback whose tasks never finish (they stay detached)."""
    with FakeAsyncProvider(polls_before_done=10_000, api_key="rh-test-key-123") as fake:
        yield fake


@pytest.fixture
def walk_stack(fake_remote, tmp_path, settings):
    # The children read the outbound allowlist from their environment: set it before they start.
    settings.OUTBOUND_ALLOWLIST = [f"http://{fake_remote.host}"]
    settings.OUTBOUND_ALLOW_HTTP = True
    env = {"REDIS_URL": "", "HEARTBEAT_SECONDS": 1, "DISPATCH_SAFETY_NET_SECONDS": 1}
    logs = tmp_path / "logs"
    running = []
    try:
        running.append(procs.qcluster(logs, workers=2, **env))
        running.append(procs.queue_service(logs, **env))
        web = procs.daphne(logs, **env)
        running.append(web)
        yield web
    finally:
        for proc in running:
            proc.stop()


class Walk:
    """The page plus what every step does after it lands: a screenshot, and at phone width
    the check that nothing scrolls sideways."""

    def __init__(self, page, base, label, phone):
        self.page, self.base, self.label, self.phone = page, base, label, phone
        self.visited = []

    def goto(self, path):
        self.page.goto(self.base + path)
        return self.landed(path)

    def landed(self, name):
        self.page.wait_for_load_state("load")
        self.visited.append(name)
        if self.phone:
            overflow = self.page.evaluate(WIDER_THAN_VIEWPORT)
            assert overflow <= 0, f"{name} scrolls sideways by {overflow} px at 390 px"
        return self

    def shot(self, step):
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{self.label}-{len(self.visited):02d}-{step}.png"), full_page=True)


def wait_until(predicate, message, timeout=45):
    return procs.wait_for(predicate, timeout=timeout, message=message)


@pytest.mark.parametrize("viewport", [(1400, 900), (390, 844)], ids=["laptop", "phone"])
def test_an_ordinary_user_walks_from_provider_to_deleted_project(walk_stack, chromium, owner, fake_remote, tmp_path, viewport):
    width, height = viewport
    assert not owner.is_staff
    context = chromium.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    walk = Walk(page, walk_stack.url, f"{width}", phone=width < 500)
    for stale in SHOTS.glob(f"{width}-*.png"):  # this run's shots only
        stale.unlink()
    log_in(page, walk.base, owner)
    walk.landed("/projects/")

    # 1. a provider (the demo family, calls take 6 s so one can be cancelled while running even
    #    when the live event that shows it running is slow on a loaded machine), its key tested
    walk.goto("/providers/new")
    page.fill("#id_name", "My demo")
    page.select_option("#id_family", "demo")
    page.fill("#id_opt_demo_latency_ms", "6000")
    page.fill("input[name=alias]", "house")
    page.fill("input[name=alias_model]", "demo-image")
    page.click("#provider-form button[type=submit]")
    page.wait_for_selector("#test-key")
    walk.landed("provider page")
    page.click("#test-key button")
    page.wait_for_selector("text=Test key: ok")
    walk.landed("provider tested").shot("provider-tested")
    provider = owner.providers.get(name="My demo")

    # ... and one at the (fake) RunningHub, whose key is tested against it
    walk.goto("/providers/new")
    page.fill("#id_name", "RH fake")
    page.select_option("#id_family", "runninghub")
    page.fill("#id_base_url", f"{fake_remote.url}/openapi/v2")
    page.fill("#id_api_key", "rh-test-key-123")
    page.click("#provider-form button[type=submit]")
    page.wait_for_selector("#test-key")
    page.click("#test-key button")
    page.wait_for_selector("text=Test key: ok")
    walk.landed("remote provider tested").shot("remote-provider-tested")
    assert fake_remote.hits["queue_status"] == 1
    remote = owner.providers.get(name="RH fake")

    # 2. a project on it
    walk.goto("/projects/")
    page.click("#new-project")
    walk.landed("/projects/new")
    page.fill("#id_name", "Foxes")
    page.select_option("#id_provider_id", str(provider.id))
    page.fill("#id_model", "house")
    page.click("#project-form button[type=submit]")
    page.wait_for_selector("#storage-usage")
    project = Project.objects.get(owner=owner, name="Foxes")
    walk.landed("project page").shot("project-created")

    # 3. drafts: three lines, one draft each, with an uploaded reference image
    page.wait_for_selector("body[data-live='1']")
    reference = tmp_path / "ref.png"
    reference.write_bytes(png((20, 120, 200, 255), (48, 32)))
    page.fill("#draft-form textarea[name=prompt]", "a fox in the snow\na fox in the rain\na fox at dusk")
    page.check("#per-line")
    page.set_input_files("#draft-form input[name=reference_files]", str(reference))
    page.click("#draft-form button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#drafts tr[data-job]').length === 3")
    drafts = sorted(Job.objects.filter(project=project), key=lambda job: job.prompt)
    assert [job.prompt for job in drafts] == ["a fox at dusk", "a fox in the rain", "a fox in the snow"]
    assert all(len(job.references) == 1 for job in drafts), [job.references for job in drafts]
    walk.landed("drafts added").shot("drafts")

    # 4. edit one: a new prompt, and another provider for it alone (one that fails every call);
    #    the provider change refreshes the fields in place and keeps what was typed
    flaky = make_provider(owner, name="Flaky", fail_rate=1, fail_kind="permanent")
    dusk, rain, snow = drafts
    page.click(f"#drafts tr[data-job='{dusk.id}'] a:text('Edit')")
    page.wait_for_selector("#edit-draft-form")
    walk.landed("draft edit")
    page.fill("#edit-draft-form textarea[name=prompt]", "a fox at dusk, edited")
    page.select_option("#edit-draft-form select[name=provider]", str(flaky.id))
    page.wait_for_function(
        f"document.querySelector('#edit-draft-form select[name=provider]').value === '{flaky.id}'"
        " && !!document.querySelector('#edit-draft-form select[name=model]')"
    )
    assert page.input_value("#edit-draft-form textarea[name=prompt]") == "a fox at dusk, edited"
    walk.shot("draft-edit")
    page.click("#edit-draft-form button[type=submit]")
    page.wait_for_selector("#draft-form")
    walk.landed("project page after edit")
    dusk.refresh_from_db()
    assert (dusk.prompt, dusk.provider_id, len(dusk.references)) == ("a fox at dusk, edited", flaky.id, 1)

    # 5. start them: the edited one fails, one of the others runs (one slot) while the last waits;
    #    cancel the running one
    page.wait_for_selector("body[data-live='1']")
    for job in drafts:
        page.check(f"#drafts tr[data-job='{job.id}'] input[name=job]")
    page.click("#start-selected")
    either = ", ".join(f"#queue tr[data-job='{job.id}'][data-state='running']" for job in (rain, snow))
    row = page.wait_for_selector(either, timeout=45_000)
    running_id = row.get_attribute("data-job")
    running, waiting = (rain, snow) if running_id == str(rain.id) else (snow, rain)
    walk.landed("started").shot("running")
    page.click(f"#queue tr[data-job='{running.id}'] button[data-cancel]")
    page.wait_for_selector(f"#queue tr[data-job='{running.id}'][data-state='cancelled']")
    wait_until(lambda: Job.objects.get(id=waiting.id).status == Status.COMPLETED, "the waiting job to complete")
    page.wait_for_selector(f"#queue tr[data-job='{dusk.id}'][data-state='failed']")
    walk.shot("cancelled-and-failed")
    running.refresh_from_db()
    assert running.status == Status.FAILED and running.error_class == "cancelled"
    assert not AlbumItem.objects.filter(job=running).exists()
    assert Job.objects.get(id=dusk.id).status == Status.FAILED

    # 6. a detached job at the remote fake provider, cancelled from its project page
    remote_project = make_project(owner, remote, name="Remote", model="workflow")
    params = {"workflow_id": "1987", "prompt_node": {"nodeId": "6", "fieldName": "text"}}
    [detached] = make_drafts(remote_project, 1, params=params)
    walk.goto(f"/projects/{remote_project.id}/")
    page.wait_for_selector("body[data-live='1']")
    page.check(f"#drafts tr[data-job='{detached.id}'] input[name=job]")
    page.click("#start-selected")
    # The provider accepts it (a worker stores the task id), then the page shows it detached.
    wait_until(lambda: Job.objects.filter(id=detached.id).exclude(task_id="").exists(), "the remote task id", timeout=90)
    page.wait_for_selector(f"#queue tr[data-job='{detached.id}'][data-state='detached']", timeout=45_000)
    walk.shot("detached")
    task_id = Job.objects.get(id=detached.id).task_id
    page.click(f"#queue tr[data-job='{detached.id}'] button[data-cancel]")
    page.wait_for_selector(f"#queue tr[data-job='{detached.id}'][data-state='cancelled']")
    # The provider is told after the cancel commits, so the page may show it first.
    wait_until(lambda: fake_remote.cancelled == [task_id], "the provider to be told of the cancel", timeout=15)
    assert task_id
    walk.goto("/queue/").shot("monitor")
    walk.goto("/providers/").shot("providers")

    # 7. the failure: mend its provider on its page, then retry the job from the job page
    walk.goto(f"/providers/{flaky.id}/")
    page.fill("#id_opt_demo_fail_rate", "0")
    page.click("#provider-form button[type=submit]")
    page.wait_for_selector("#test-key")
    walk.goto(f"/jobs/{dusk.id}/")
    assert page.inner_text("#job-error")
    walk.shot("job-failed")
    page.click("#job-retry")
    walk.landed("job retried")
    wait_until(lambda: Job.objects.get(id=dusk.id).status == Status.COMPLETED, "the retried job to complete")
    page.wait_for_selector("#outputs a[data-lightbox], #outputs img", timeout=30_000)
    assert page.locator("#attempts [data-attempt]").count() == 2  # numbered across the retry
    walk.landed("job completed").shot("job-completed")

    # 8. the album's lightbox on the project page
    walk.goto(f"/projects/{project.id}/")
    page.wait_for_function("document.querySelectorAll('#album a[data-lightbox]').length === 2")
    page.locator("#album a[data-lightbox]").first.click()
    page.wait_for_selector("#lightbox[open]")
    page.wait_for_selector("#lb-stage img", state="visible")  # seen once its picture has loaded
    walk.landed("lightbox").shot("lightbox")
    assert page.inner_text("#lb-count") == "1 / 2"
    page.click("#lb-next")
    page.wait_for_function("document.getElementById('lb-count').textContent === '2 / 2'")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("document.getElementById('lb-count').textContent === '1 / 2'")
    page.keyboard.press("Escape")
    page.wait_for_selector("#lightbox:not([open])", state="attached")

    # 9. the album as one zip
    with page.expect_download() as info:
        page.click("#album-zip")
    body = open(info.value.path(), "rb").read()
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        assert archive.testzip() is None
        names = archive.namelist()
    assert len(names) == AlbumItem.objects.filter(project=project).count() == 2
    walk.shot("album")

    # 10. delete the project: its jobs, album and files go
    files = [item.file.path for item in AlbumItem.objects.filter(project=project)]
    assert len(files) == 2 and all(os.path.exists(path) for path in files)
    walk.goto(f"/projects/{project.id}/delete")
    walk.shot("delete")
    page.click("main form button[type=submit]")
    page.wait_for_url(f"{walk.base}/projects/")
    walk.landed("/projects/ after delete").shot("deleted")
    assert not Project.objects.filter(id=project.id).exists()
    assert not AlbumItem.objects.filter(project_id=project.id).exists()
    assert not any(os.path.exists(path) for path in files)
    context.close()
