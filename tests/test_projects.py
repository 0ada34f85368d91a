"""Projects as an ordinary (non-staff) user manages them: create, edit, archive, delete —
on the pages and through the API."""

import json

import pytest
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from queue_app.models import AlbumItem, Job, Project, Status
from queue_app.selectors.projects import storage_summary
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def album_item(project, *, size=1000, job=None):
    item = AlbumItem(project=project, owner=project.owner, job=job, kind="image", content_type="image/png", size=size)
    item.file.save("out.png", ContentFile(b"x" * size), save=False)
    item.save()
    return item


def running_job(project, provider, slot=0):
    return Job.objects.create(
        project=project, owner=project.owner, prompt="p", status=Status.PROCESSING, active_provider=provider, slot=slot
    )


def test_a_new_user_creates_a_project_from_the_page(signed_in, owner, provider):
    page = signed_in.get("/projects/")
    assert b'href="/projects/new"' in page.content
    form = {"name": "Foxes", "kind": "image", "provider_id": provider.id, "model": "demo-image", "aspect_ratio": "16:9"}
    response = signed_in.post("/projects/new", form)
    project = Project.objects.get(owner=owner)
    assert response.status_code == 302 and response["Location"] == f"/projects/{project.id}/"
    assert (project.name, project.provider_id, project.model) == ("Foxes", provider.id, "demo-image")
    assert project.aspect_ratio == "16:9"


def test_the_form_refuses_a_model_the_provider_does_not_offer_and_creates_nothing(signed_in, provider):
    form = {"name": "Foxes", "kind": "image", "provider_id": provider.id, "model": "dall-e-3"}
    response = signed_in.post("/projects/new", form)
    assert response.status_code == 200
    assert "not offered by provider" in response.content.decode()
    assert not Project.objects.exists()


def test_someone_elses_provider_cannot_be_chosen(signed_in, outsider):
    theirs = make_provider(outsider, name="Theirs")
    response = signed_in.post("/projects/new", {"name": "X", "kind": "image", "provider_id": theirs.id})
    assert response.status_code == 200 and not Project.objects.exists()


def test_edit_renames_and_changes_defaults(signed_in, project):
    form = signed_in.get(f"/projects/{project.id}/edit").content.decode()
    assert f'<option value="{project.provider_id}" selected>' in form and 'value="demo-image"' in form
    response = signed_in.post(
        f"/projects/{project.id}/edit",
        {"name": "Renamed", "kind": "image", "provider_id": project.provider_id, "model": "demo-layers", "quality": ""},
    )
    assert response.status_code == 302
    project.refresh_from_db()
    assert (project.name, project.model) == ("Renamed", "demo-layers")


def test_an_outsider_cannot_open_or_edit_the_project(client, outsider, project):
    client.force_login(outsider)
    assert client.get(f"/projects/{project.id}/edit").status_code == 404
    assert client.post(f"/projects/{project.id}/edit", {"name": "Mine", "kind": "image"}).status_code == 404
    assert client.post(f"/projects/{project.id}/delete").status_code == 404
    assert Project.objects.get(id=project.id).name == "Project"


def test_archived_projects_leave_the_list_and_come_back(signed_in, owner, project):
    other = make_project(owner, name="Other")
    signed_in.post(f"/projects/{project.id}/archive", {"archived": "1"})
    listed = signed_in.get("/projects/")
    assert [p.id for p in listed.context["projects"]] == [other.id]
    assert "1 project" in listed.content.decode() and "1 projects" not in listed.content.decode()
    assert "1 archived project" in listed.content.decode()
    assert [p.id for p in signed_in.get("/projects/?show=archived").context["projects"]] == [project.id]
    signed_in.post(f"/projects/{project.id}/archive", {"archived": "0"})
    assert len(signed_in.get("/projects/").context["projects"]) == 2


def test_delete_asks_with_counts_then_removes_jobs_album_and_files(signed_in, owner, project):
    jobs = make_drafts(project, 3)
    item = album_item(project, size=2_621_440, job=jobs[0])  # 2.5 MiB
    path = item.file.name
    assert default_storage.exists(path)
    confirm = signed_in.get(f"/projects/{project.id}/delete")
    summary = " ".join(confirm.content.decode().split())
    assert "This deletes 3 jobs and 1 album item (2.5 MB of files, freed from your storage)" in summary
    response = signed_in.post(f"/projects/{project.id}/delete")
    assert response.status_code == 302 and response["Location"] == "/projects/"
    assert not Project.objects.filter(id=project.id).exists()
    assert not Job.objects.exists() and not AlbumItem.objects.exists()
    assert not default_storage.exists(path)
    assert not default_storage.exists(f"album/{project.id}")  # the emptied folder goes too
    assert storage_summary(owner)["used_bytes"] == 0


def test_delete_cancels_the_projects_pending_and_running_work_first(signed_in, project, provider):
    running = running_job(project, provider)
    [pending] = make_drafts(project, 1)
    Job.objects.filter(id=pending.id).update(status=Status.PENDING)
    elsewhere = running_job(make_project(project.owner, provider), provider, slot=1)  # another project's job stays
    confirm = signed_in.get(f"/projects/{project.id}/delete")
    assert "2 jobs are pending or running: they are cancelled first" in " ".join(confirm.content.decode().split())
    response = signed_in.post(f"/projects/{project.id}/delete", follow=True)
    assert "(2 pending or running jobs cancelled first)" in " ".join(response.content.decode().split())
    assert not Project.objects.filter(id=project.id).exists() and not Job.objects.filter(id=running.id).exists()
    assert Job.objects.get(id=elsewhere.id).status == Status.PROCESSING


# --- API ----------------------------------------------------------------------------------


def send(client, method, url, body=None):
    return getattr(client, method)(url, data=json.dumps(body) if body is not None else None, content_type="application/json")


def test_api_creates_lists_changes_and_deletes_a_project(signed_in, owner, provider):
    created = send(signed_in, "post", "/api/projects", {"name": "API", "kind": "image", "provider_id": provider.id})
    assert created.status_code == 201
    project_id = created.json()["id"]
    assert [p["name"] for p in signed_in.get("/api/projects").json()["projects"]] == ["API"]
    changed = send(signed_in, "patch", f"/api/projects/{project_id}", {"name": "Renamed", "archived": True})
    assert changed.status_code == 200 and changed.json()["archived"] is True
    assert signed_in.get("/api/projects").json()["projects"] == []
    assert [p["name"] for p in signed_in.get("/api/projects?archived=true").json()["projects"]] == ["Renamed"]
    detail = signed_in.get(f"/api/projects/{project_id}").json()
    assert detail["footprint"] == {"jobs": 0, "active": 0, "album_items": 0, "bytes": 0}
    deleted = send(signed_in, "delete", f"/api/projects/{project_id}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert not Project.objects.exists()


@pytest.mark.parametrize(
    "body, message",
    [
        ({}, "a project needs a name"),
        ({"name": "x", "kind": "hologram"}, "kind must be one of"),
        ({"name": "x", "duration": "long"}, "duration must be a whole number"),
        ({"name": "x", "temperature": 7}, "temperature must be a number from 0 to 2"),
        ({"name": "x", "colour": "red"}, "unknown field(s): colour"),
        ({"name": "x", "provider_id": 99999}, "provider not found"),
    ],
)
def test_api_refuses_bad_projects_with_a_json_error(signed_in, body, message):
    response = send(signed_in, "post", "/api/projects", body)
    assert response.status_code in (400, 404)
    assert message in response.json()["error"]
    assert not Project.objects.exists()


def test_a_refused_patch_changes_nothing(signed_in, project):
    response = send(signed_in, "patch", f"/api/projects/{project.id}", {"name": "New", "archived": "yes"})
    assert response.status_code == 400
    response = send(signed_in, "patch", f"/api/projects/{project.id}", {"name": "New", "model": "nope"})
    assert response.status_code == 400
    project.refresh_from_db()
    assert (project.name, project.archived) == ("Project", False)


def test_api_delete_cancels_running_work_and_refuses_outsiders(client, signed_in, outsider, project, provider):
    running_job(project, provider)
    client.force_login(outsider)
    assert send(client, "delete", f"/api/projects/{project.id}").status_code == 404
    assert send(client, "patch", f"/api/projects/{project.id}", {"name": "x"}).status_code == 404
    assert Project.objects.filter(id=project.id).exists()
    client.force_login(project.owner)
    deleted = send(client, "delete", f"/api/projects/{project.id}")
    assert deleted.status_code == 200 and deleted.json()["cancelled"] == 1
    assert not Project.objects.filter(id=project.id).exists()


# --- Small items of issue 12, point 9 -------------------------------------------------------


def test_a_job_not_started_shows_a_dash_not_none(signed_in, project):
    make_drafts(project, 1, status=Status.PENDING)
    sections = signed_in.get(f"/projects/{project.id}/?fragment=1").content.decode()
    started_cells = [row.split("</td>")[-2] for row in sections.split("<tr")[2:] if "</td>" in row]
    assert started_cells and all("None" not in cell for cell in started_cells)
    assert '<td class="small">—' in sections


def test_the_draft_form_labels_read_like_words(signed_in, project):
    page = signed_in.get(f"/projects/{project.id}/").content.decode()
    assert "<label>Aspect ratio<select" in page and "Aspectratio" not in page


def test_delete_selected_with_nothing_ticked_says_so(signed_in, project):
    make_drafts(project, 2)
    response = signed_in.post(f"/projects/{project.id}/drafts/delete", {}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["select drafts first: nothing was deleted"]
    assert Job.objects.count() == 2


def test_the_monitor_project_filter_names_projects_even_without_work(signed_in, owner, project):
    quiet = make_project(owner, name="Quiet one")
    page = signed_in.get(f"/queue/?project={quiet.id}").content.decode()
    assert f'<option value="{quiet.id}" selected>Quiet one</option>' in page
    assert f'<option value="{project.id}">Project</option>' in page
    assert f">#{quiet.id}<" not in page and f"Project #{quiet.id}" not in page


def test_the_monitor_says_1_project_not_1_projects(signed_in, project):
    make_drafts(project, 1, status=Status.PENDING)
    page = " ".join(signed_in.get("/queue/?fragment=1").content.decode().split())
    assert "<b>1</b><span>project</span>" in page


def test_site_url_follows_port():
    import os
    import subprocess
    import sys

    env = {**os.environ, "PORT": "8123", "DEBUG": "True", "DJANGO_SETTINGS_MODULE": "remixstudio.settings"}
    env.pop("SITE_URL", None)
    code = "import django; django.setup(); from django.conf import settings; print(settings.SITE_URL)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "http://127.0.0.1:8123"


# --- In a browser: a non-staff user from nothing to a project and back ---------------------


@pytest.mark.browser
@pytest.mark.processes
def test_a_new_user_adds_a_provider_tests_it_creates_and_deletes_a_project_in_chromium(owner, tmp_path, chromium):
    from tests import procs
    from tests.test_browser import log_in

    web = procs.daphne(tmp_path / "logs", REDIS_URL="")
    try:
        page = chromium.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(30_000)
        base = web.url
        log_in(page, base, owner)
        assert "No projects yet" in page.inner_text("#project-list")
        # a provider, its options shown for its family only
        page.goto(f"{base}/providers/new")
        page.fill("#id_name", "My demo")
        page.select_option("#id_family", "demo")
        assert page.is_visible("#id_opt_demo_latency_ms") and not page.is_visible("#id_opt_openai_organization")
        page.fill("#id_opt_demo_latency_ms", "50")
        page.fill("input[name=alias]", "house")
        page.fill("input[name=alias_model]", "demo-image")
        page.click("#provider-form button[type=submit]")
        page.wait_for_selector("#test-key")
        page.click("#test-key button")
        page.wait_for_selector("text=Test key: ok")
        shots = settings.BASE_DIR / "var" / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "provider-1400.png"), full_page=True)
        provider = owner.providers.get()
        assert (provider.options, provider.model_aliases) == ({"latency_ms": 50}, {"house": "demo-image"})
        # a project on it
        page.goto(f"{base}/projects/")
        page.click("#new-project")
        page.fill("#id_name", "Foxes")
        page.select_option("#id_provider_id", str(provider.id))
        page.fill("#id_model", "house")
        page.click("#project-form button[type=submit]")
        page.wait_for_selector("#storage-usage")
        project = Project.objects.get(owner=owner)
        assert page.url == f"{base}/projects/{project.id}/" and project.model == "house"
        page.screenshot(path=str(shots / "project-created-1400.png"), full_page=True)
        # what a start would reserve, for all drafts and for the ticked ones
        make_drafts(project, 3)
        page.reload()
        assert "Starting all 3 drafts would reserve 75 MB" in page.inner_text("#storage-start")
        page.locator("#drafts input[name=job]").nth(0).check()
        page.locator("#drafts input[name=job]").nth(1).check()
        assert page.inner_text("#storage-selected") == "Starting the 2 selected would reserve 50 MB."
        # the new pages' content fits a phone (390 px) (the header and tables: the phone layout's work)
        page.set_viewport_size({"width": 390, "height": 844})
        rightmost = "Math.max(...[...document.querySelectorAll('main *')].map((e) => e.getBoundingClientRect().right))"
        for path in (f"/providers/{provider.id}/", "/projects/new", f"/projects/{project.id}/edit"):
            page.goto(base + path)
            assert page.evaluate(rightmost) <= 390, path
        page.screenshot(path=str(shots / "project-edit-390.png"), full_page=True)
        page.set_viewport_size({"width": 1400, "height": 900})
        # and gone again
        page.goto(f"{base}/projects/{project.id}/delete")
        assert "This deletes 3 jobs and 0 album items" in " ".join(page.inner_text("#delete-summary").split())
        page.click("main form button[type=submit]")
        page.wait_for_url(f"{base}/projects/")
        assert not Project.objects.exists()
    finally:
        web.stop()
