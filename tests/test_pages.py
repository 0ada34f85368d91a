"""Project pages: list, Drafts / Queue / Album sections, the actions, the account page."""

import pytest

from queue_app.models import AlbumItem, Job, Kind, Provider, Status
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def test_the_project_list_counts_jobs_by_status(signed_in, owner, project):
    jobs = make_drafts(project, 3)
    Job.objects.filter(id=jobs[0].id).update(status=Status.FAILED)
    response = signed_in.get("/projects/")
    [row] = response.context["projects"]
    assert row.counts == {"draft": 2, "failed": 1}


def test_drafts_carry_output_settings_within_what_the_model_offers(signed_in, project):
    response = signed_in.post(
        f"/projects/{project.id}/drafts", {"prompt": "a fox", "quantity": "2", "aspect_ratio": "16:9", "quality": "high"}
    )
    assert response.status_code == 302
    assert Job.objects.filter(status=Status.DRAFT, aspect_ratio="16:9", quality="high").count() == 2
    signed_in.post(f"/projects/{project.id}/drafts", {"prompt": "a fox", "quantity": "1", "aspect_ratio": "7:1"})
    signed_in.post(f"/projects/{project.id}/drafts", {"prompt": "a fox", "quantity": "1", "model": "gpt-image-1"})
    assert Job.objects.count() == 2  # an unoffered ratio or model creates nothing
    page = signed_in.get(f"/projects/{project.id}/")
    offered = {field["name"]: field["values"] for field in page.context["option_fields"]}
    assert offered["aspect_ratio"][:2] == ["1:1", "4:3"]
    assert "not offered" in " ".join(str(m) for m in page.context["messages"])


def test_start_selected_and_start_all(signed_in, project, inline_tasks):
    jobs = make_drafts(project, 3)
    signed_in.post(f"/projects/{project.id}/start", {"job": [str(jobs[0].id)]})
    assert Job.objects.get(id=jobs[0].id).status != Status.DRAFT
    assert Job.objects.filter(status=Status.DRAFT).count() == 2
    signed_in.post(f"/projects/{project.id}/start", {"all": "1"})
    assert not Job.objects.filter(status=Status.DRAFT).exists()


def test_delete_selected_drafts_only(signed_in, project):
    jobs = make_drafts(project, 3)
    Job.objects.filter(id=jobs[2].id).update(status=Status.FAILED)
    signed_in.post(f"/projects/{project.id}/drafts/delete", {"job": [str(j.id) for j in jobs]})
    assert list(Job.objects.values_list("status", flat=True)) == [Status.FAILED]


def test_retry_selected_failures(signed_in, project, inline_tasks):
    jobs = make_drafts(project, 2)
    Job.objects.filter(id__in=[j.id for j in jobs]).update(status=Status.FAILED, error="boom")
    signed_in.post(f"/projects/{project.id}/retry", {"job": [str(jobs[0].id)]})
    assert Job.objects.get(id=jobs[0].id).status != Status.FAILED
    assert Job.objects.get(id=jobs[1].id).status == Status.FAILED


def test_clear_failed_from_the_project_page_confirms_and_returns(signed_in, project):
    jobs = make_drafts(project, 2)
    Job.objects.filter(id__in=[j.id for j in jobs]).update(status=Status.FAILED)
    data = {"scope": "project", "project": project.id, "next": f"/projects/{project.id}/"}
    assert signed_in.post("/queue/failed/clear", data).context["count"] == 2
    response = signed_in.post("/queue/failed/clear", {**data, "confirm": "1"})
    assert response["Location"] == f"/projects/{project.id}/" and not Job.objects.exists()


def test_the_queue_section_shows_derived_states_reasons_and_errors(signed_in, project, provider):
    jobs = make_drafts(project, 2)
    Provider.objects.filter(id=provider.id).update(paused=True)
    Job.objects.filter(id=jobs[0].id).update(status=Status.PENDING)
    Job.objects.filter(id=jobs[1].id).update(status=Status.FAILED, error="the model refused the prompt")
    response = signed_in.get(f"/projects/{project.id}/?fragment=1")
    html = response.content.decode()
    rows = {r["id"]: r for r in response.context["queue"]}
    assert rows[str(jobs[0].id)]["state"] == "waiting" and rows[str(jobs[0].id)]["waiting_reason"] == "provider paused"
    assert "provider paused" in html and "the model refused the prompt" in html and "<html" not in html


def test_the_album_groups_layers_under_their_job(signed_in, owner, inline_tasks):
    provider = make_provider(owner)
    project = make_project(owner, provider, model="demo-layers")
    [job] = make_drafts(project, 1)
    signed_in.post(f"/projects/{project.id}/start", {"all": "1"})
    inline_tasks.run()
    assert AlbumItem.objects.filter(job=job).count() == 4
    [group] = signed_in.get(f"/projects/{project.id}/").context["album"]
    assert [i.role for i in group["main"]] == ["composite"] and len(group["layers"]) == 3
    item = group["layers"][0]
    assert signed_in.get(f"/album/{item.id}/file").status_code == 200


def test_a_comfyui_project_links_to_its_settings(signed_in, owner):
    project = make_project(owner, None, kind=Kind.COMFYUI, name="Comfy")
    assert f'href="/projects/{project.id}/comfyui/"' in signed_in.get(f"/projects/{project.id}/").content.decode()
    assert signed_in.get(f"/projects/{project.id}/comfyui/").status_code == 200  # the link leads somewhere


def test_staff_can_open_any_project_and_the_account_page_has_a_preferences_block(client, staff, project):
    client.force_login(staff)
    assert client.get(f"/projects/{project.id}/").status_code == 200
    assert client.get("/account/").status_code == 200
    from django.template.loader import get_template

    assert "preferences" in get_template("queue_app/account.html").template.source
