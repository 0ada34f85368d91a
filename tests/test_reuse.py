"""Reuse (issue 29): "do that again with this change" from a job, a failed job or an album
item, the recent prompts of a project, and saved prompt templates per user."""

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from queue_app.models import AlbumItem, Job, Status
from queue_app.services.errors import ServiceError
from queue_app.services.reuse import jobs_reuse
from queue_app.web import tokens
from tests.conftest import make_drafts, make_job, make_project, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(owner):
    return Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=owner, name='reuse')[1]}")


def post(api, url, body):
    return api.post(url, data=json.dumps(body), content_type="application/json")


def test_a_failed_job_is_done_again_with_its_settings_and_the_change(owner):
    other = make_provider(owner, name="Other")
    project = make_project(owner)
    failed = make_job(
        project,
        Status.FAILED,
        prompt="a fox",
        provider=other,
        model="demo-image",
        aspect_ratio="16:9",
        references=["https://example.com/a.png"],
        params={"seed": 3},
    )
    [draft] = jobs_reuse(
        user=owner, project=project, job_ids=[failed.id], prompt="{prompt}, in watercolour", settings_={"quality": "high"}
    )
    assert draft.status == Status.DRAFT and draft.id != failed.id
    assert (draft.prompt, draft.provider_id, draft.model, draft.aspect_ratio, draft.quality) == (
        "a fox, in watercolour",
        other.id,
        "demo-image",
        "16:9",
        "high",
    )
    assert draft.references == ["https://example.com/a.png"] and draft.params == {"seed": 3}
    assert Job.objects.get(id=failed.id).status == Status.FAILED  # the original is left as it was


def test_reuse_refuses_jobs_of_another_project_and_bad_changes(owner):
    project, elsewhere = make_project(owner), make_project(owner, name="Elsewhere")
    [job] = make_drafts(elsewhere)
    with pytest.raises(ServiceError, match="not found"):
        jobs_reuse(user=owner, project=project, job_ids=[job.id])
    [mine] = make_drafts(project)
    with pytest.raises(ServiceError, match="unknown setting"):
        jobs_reuse(user=owner, project=project, job_ids=[mine.id], settings_={"colour": "red"})
    assert Job.objects.count() == 2


def test_an_album_item_is_reused_through_the_api(api, owner):
    project = make_project(owner)
    job = make_job(project, Status.COMPLETED, prompt="an owl", aspect_ratio="1:1")
    item = AlbumItem.objects.create(project=project, owner=owner, job=job, kind="text", text="hoo", prompt="an owl")
    made = post(api, f"/api/projects/{project.id}/reuse", {"album_item_ids": [item.id], "prompt": "{prompt} at dawn"})
    assert made.status_code == 201
    draft = Job.objects.get(id=made.json()["job_ids"][0])
    assert (draft.prompt, draft.aspect_ratio, draft.status) == ("an owl at dawn", "1:1", Status.DRAFT)


def test_the_job_page_reuse_button_makes_a_draft(client, owner):
    client.force_login(owner)
    project = make_project(owner)
    job = make_job(project, Status.COMPLETED, prompt="a fox")
    assert "Reuse" in client.get(f"/jobs/{job.id}/").content.decode()
    answer = client.post(f"/jobs/{job.id}/reuse", {"prompt": "{prompt} in the rain"})
    assert answer.status_code == 302
    assert Job.objects.filter(status=Status.DRAFT, prompt="a fox in the rain").count() == 1


def test_recent_prompts_and_templates_are_offered_on_the_generate_page(api, client, owner):
    project = make_project(owner)
    now = timezone.now()
    for minutes, prompt in ((3, "older"), (2, "newer"), (1, "newer")):
        job = make_job(project, Status.DRAFT, prompt=prompt)
        Job.objects.filter(id=job.id).update(created_at=now - timedelta(minutes=minutes))
    assert api.get(f"/api/projects/{project.id}/prompts").json()["prompts"] == ["newer", "older"]
    assert post(api, "/api/templates", {"name": "Fox", "text": "a {red|blue} fox"}).status_code == 200
    client.force_login(owner)
    page = client.get(f"/projects/{project.id}/generate").content.decode()
    assert 'data-add-prompt="a {red|blue} fox"' in page and 'data-add-prompt="newer"' in page
    assert api.get("/api/templates").json() == {"templates": [{"name": "Fox", "text": "a {red|blue} fox"}]}
    assert api.delete("/api/templates/Fox").status_code == 200 and api.delete("/api/templates/Fox").status_code == 404


def test_the_templates_page_saves_and_deletes(client, owner):
    client.force_login(owner)
    assert client.post("/account/templates", {"name": "Owl", "text": "an owl"}).status_code == 302
    assert "an owl" in client.get("/account/templates").content.decode()
    client.post("/account/templates/Owl/delete")
    assert "an owl" not in client.get("/account/templates").content.decode()


def test_a_selection_fans_out_to_several_providers_each_with_a_model_it_knows(api, owner):
    demo, openai = make_provider(owner, name="Demo"), make_provider(owner, name="OpenAI", family="openai")
    project = make_project(owner, demo, model="demo-image")
    fox = make_job(project, Status.COMPLETED, prompt="a fox", model="demo-image", aspect_ratio="1:1")
    owl = make_job(project, Status.DRAFT, prompt="an owl")
    made = post(
        api, f"/api/projects/{project.id}/reuse", {"job_ids": [str(fox.id), str(owl.id)], "provider_ids": [demo.id, openai.id]}
    )
    assert made.status_code == 201
    drafts = [Job.objects.get(id=job_id) for job_id in made.json()["job_ids"]]
    assert [(d.prompt, d.provider_id) for d in drafts] == [
        ("a fox", demo.id),
        ("a fox", openai.id),
        ("an owl", demo.id),
        ("an owl", openai.id),
    ]
    assert drafts[0].model == "demo-image" and drafts[1].model.startswith("gpt-image")  # demo's model means nothing to OpenAI
    assert drafts[1].aspect_ratio == "1:1"
    missing = post(api, f"/api/projects/{project.id}/reuse", {"job_ids": [str(fox.id)], "provider_ids": [demo.id, 999999]})
    assert missing.status_code == 404 and Job.objects.count() == 6
