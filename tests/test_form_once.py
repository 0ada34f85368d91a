"""A page form sent twice does its work once: every form that creates or starts something
carries a one-time token (web/form_once.py), so a double click, a reload after the POST or
the back button and "send" again gets the first answer back."""

import re

import pytest

from queue_app.models import ApiToken, Job, Project, Status
from queue_app.services import form_once
from tests.conftest import make_drafts

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def token_of(page, form_id: str) -> str:
    """The one-time token inside the form with this id on a rendered page."""
    html = page.content.decode()
    form = html[html.index(f'id="{form_id}"') :]
    return re.search(r'name="form_token" value="([0-9a-f]+)"', form).group(1)


def test_the_add_drafts_form_sent_twice_makes_its_drafts_once(signed_in, project):
    token = token_of(signed_in.get(f"/projects/{project.id}/"), "draft-form")
    form = {"prompt": "a fox", "quantity": "2", "form_token": token}
    first = signed_in.post(f"/projects/{project.id}/drafts", form)
    again = signed_in.post(f"/projects/{project.id}/drafts", form, follow=True)
    assert first.status_code == 302 and again.redirect_chain[0][0] == first["Location"]
    assert Job.objects.filter(project=project, status=Status.DRAFT).count() == 2
    assert "already sent" in " ".join(str(m) for m in again.context["messages"])


def test_the_same_token_with_other_content_is_a_new_request(signed_in, project):
    token = token_of(signed_in.get(f"/projects/{project.id}/"), "draft-form")
    signed_in.post(f"/projects/{project.id}/drafts", {"prompt": "a fox", "form_token": token})
    signed_in.post(f"/projects/{project.id}/drafts", {"prompt": "a hare", "form_token": token})
    assert sorted(Job.objects.values_list("prompt", flat=True)) == ["a fox", "a hare"]


def test_a_fetch_answer_is_repeated_and_carries_the_next_token(signed_in, project):
    token = token_of(signed_in.get(f"/projects/{project.id}/"), "draft-form")
    form = {"prompt": "a fox", "form_token": token}
    first = signed_in.post(f"/projects/{project.id}/drafts", form, headers={"X-Requested-With": "fetch"})
    again = signed_in.post(f"/projects/{project.id}/drafts", form, headers={"X-Requested-With": "fetch"})
    assert first.json()["created"] == 1 and again.json() == first.json()
    assert Job.objects.count() == 1
    assert re.fullmatch(r"[0-9a-f]{32}", first["X-Form-Token"]) and first["X-Form-Token"] != token
    nxt = {"prompt": "a fox", "form_token": first["X-Form-Token"]}
    signed_in.post(f"/projects/{project.id}/drafts", nxt, headers={"X-Requested-With": "fetch"})
    assert Job.objects.count() == 2  # the same prompt again, on purpose: the next token


def test_start_and_duplicate_sent_twice_act_once(signed_in, project, inline_tasks):
    drafts = make_drafts(project, 2)
    page = signed_in.get(f"/projects/{project.id}/")
    form = {"job": [str(drafts[0].id)], "form_token": token_of(page, "drafts-form")}
    signed_in.post(f"/projects/{project.id}/drafts/duplicate", form)
    signed_in.post(f"/projects/{project.id}/drafts/duplicate", form)
    assert Job.objects.filter(status=Status.DRAFT).count() == 3
    start = {"all": "1", "form_token": token_of(signed_in.get(f"/projects/{project.id}/"), "drafts-form")}
    signed_in.post(f"/projects/{project.id}/start", start)
    make_drafts(project, 1, prompt="typed after the start")
    signed_in.post(f"/projects/{project.id}/start", start)  # a reload of the POST
    assert list(Job.objects.filter(status=Status.DRAFT).values_list("prompt", flat=True)) == ["typed after the start 0"]


def test_project_and_token_forms_sent_twice_create_one(signed_in, owner, provider):
    token = token_of(signed_in.get("/projects/new"), "project-form")
    form = {"name": "Foxes", "kind": "image", "provider_id": provider.id, "model": "demo-image", "form_token": token}
    first = signed_in.post("/projects/new", form)
    again = signed_in.post("/projects/new", form)
    assert Project.objects.filter(owner=owner).count() == 1 and again["Location"] == first["Location"]
    account = signed_in.get("/account/").content.decode()
    token = re.search(r'name="form_token" value="([0-9a-f]+)"', account[account.index("account/tokens") :]).group(1)
    for _ in range(2):
        signed_in.post("/account/tokens", {"name": "laptop", "form_token": token})
    assert ApiToken.objects.filter(owner=owner).count() == 1


def test_a_form_shown_again_with_its_error_frees_its_token(signed_in, owner, provider):
    token = token_of(signed_in.get("/projects/new"), "project-form")
    refused = {"name": "Foxes", "kind": "image", "provider_id": provider.id, "model": "dall-e-3", "form_token": token}
    assert signed_in.post("/projects/new", refused).status_code == 200
    assert signed_in.post("/projects/new", refused).status_code == 200  # refused again, not replayed
    assert not Project.objects.exists()


def test_a_repeat_waits_for_the_first_answer_and_never_runs_twice(owner):
    row = form_once.form_claim(user=owner, token="t", fingerprint="f", scope="/x")
    assert form_once.form_claim(user=owner, token="t", fingerprint="f", scope="/x") is None
    assert form_once.form_answer(user=owner, token="t", fingerprint="f", wait=0) is None  # still running
    form_once.form_finish(row, answer={"redirect": "/done"}, status=302)
    assert form_once.form_answer(user=owner, token="t", fingerprint="f", wait=0) == {"redirect": "/done"}
    other = form_once.form_claim(user=owner, token="t2", fingerprint="f", scope="/x")
    form_once.form_release(other)
    assert form_once.form_claim(user=owner, token="t2", fingerprint="f", scope="/x") is not None
