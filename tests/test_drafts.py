"""Drafts as a user works with them (issue 12): one draft per line, edit, duplicate,
delete, select all across pages, the paginated list, a provider and model per draft, and
the page's fields that follow the provider and model without a reload — plus one short
browser test that typing survives a model change and a save, and a reference goes up by
the file input.
"""

import io

import pytest
from PIL import Image

from queue_app.models import Job, Reference, Status
from queue_app.services.drafts import draft_update, jobs_create_drafts
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_start
from queue_app.services.storage import reference_store
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


def png_bytes(color=(200, 30, 30), size=(4, 3)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def fetch_post(client, url, data):
    """A POST the way the project page sends it (fetch, JSON messages back)."""
    response = client.post(url, data, HTTP_X_REQUESTED_WITH="fetch")
    assert response.status_code == 200
    return response.json()


# --- One draft per line -----------------------------------------------------------------


def test_one_draft_per_line_makes_quantity_drafts_of_each_non_blank_line(signed_in, project):
    form = {"prompt": "a fox\n\n  an owl  \na hare\n", "quantity": "2", "per_line": "on"}
    body = fetch_post(signed_in, f"/projects/{project.id}/drafts", form)
    assert body["created"] == 6
    prompts = sorted(Job.objects.filter(project=project).values_list("prompt", flat=True))
    assert prompts == ["a fox", "a fox", "a hare", "a hare", "an owl", "an owl"]


def test_without_the_switch_a_multi_line_prompt_is_one_draft(signed_in, project):
    fetch_post(signed_in, f"/projects/{project.id}/drafts", {"prompt": "line one\nline two", "quantity": "1"})
    assert list(Job.objects.values_list("prompt", flat=True)) == ["line one\nline two"]


def test_per_line_over_the_request_limit_creates_nothing_and_says_the_count(owner, project):
    prompt = "\n".join(f"p{i}" for i in range(300))
    with pytest.raises(ServiceError, match="600 drafts"):
        jobs_create_drafts(user=owner, project=project, prompt=prompt, quantity=2, per_line=True)
    assert not Job.objects.exists()


def test_the_api_and_mcp_take_the_per_line_flag(client, owner, project):
    from queue_app.web import tokens

    _, raw = tokens.token_create(user=owner, name="t")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    response = client.post(
        f"/api/projects/{project.id}/drafts", {"prompt": "a\nb\nc", "per_line": True}, content_type="application/json", **auth
    )
    assert response.status_code == 201 and response.json()["count"] == 3
    response = client.post(
        f"/api/projects/{project.id}/drafts", {"prompt": "a", "per_line": "yes"}, content_type="application/json", **auth
    )
    assert response.status_code == 400 and "per_line" in response.json()["error"]
    rpc = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "create_drafts", "arguments": {"project_id": project.id, "prompt": "x\ny", "per_line": True}},
    }
    accept = {"HTTP_ACCEPT": "application/json, text/event-stream"}
    response = client.post("/mcp", rpc, content_type="application/json", **accept, **auth)
    assert response.status_code == 200, response.content
    assert Job.objects.filter(project=project).count() == 5


# --- Typing is never lost -----------------------------------------------------------------


def test_the_model_fields_come_as_a_partial_with_the_chosen_models_settings(signed_in, owner, project):
    response = signed_in.get(f"/projects/{project.id}/drafts/options", {"model": "demo-layers"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "<textarea" not in html and "<html" not in html  # only the fields: the prompt is never replaced
    assert 'value="demo-layers" selected' in html
    assert 'name="quality"' not in html  # the layered model offers no quality
    html = signed_in.get(f"/projects/{project.id}/drafts/options", {"model": "demo-image"}).content.decode()
    assert 'name="quality"' in html


def test_a_failed_add_reports_no_drafts_so_the_page_keeps_the_prompt(signed_in, project):
    body = fetch_post(signed_in, f"/projects/{project.id}/drafts", {"prompt": "a fox", "quantity": "1", "aspect_ratio": "7:1"})
    assert body["created"] == 0
    assert "not offered" in body["messages"][0]["text"]


# --- Edit, duplicate, delete, selection ---------------------------------------------------


def test_a_draft_is_edited_in_prompt_and_settings_and_blank_settings_return_to_the_project(signed_in, project):
    [job] = make_drafts(project, 1, aspect_ratio="16:9", quality="high")
    page = signed_in.get(f"/projects/{project.id}/drafts/{job.id}/edit")
    assert page.status_code == 200 and job.prompt in page.content.decode()
    response = signed_in.post(
        f"/projects/{project.id}/drafts/{job.id}/edit", {"prompt": "a grey owl", "model": "demo-image", "aspect_ratio": "4:3"}
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.prompt, job.aspect_ratio, job.quality, job.status) == ("a grey owl", "4:3", "", Status.DRAFT)


def test_a_bad_edit_changes_nothing_and_keeps_what_was_typed(signed_in, project):
    [job] = make_drafts(project, 1)
    response = signed_in.post(f"/projects/{project.id}/drafts/{job.id}/edit", {"prompt": "typed text", "aspect_ratio": "7:1"})
    assert response.status_code == 200
    assert "typed text" in response.content.decode()
    job.refresh_from_db()
    assert job.prompt != "typed text" and job.aspect_ratio == ""


def test_a_started_job_can_no_longer_be_edited(owner, project):
    [job] = make_drafts(project, 1)
    Job.objects.filter(id=job.id).update(status=Status.PENDING)
    with pytest.raises(ServiceError, match="no longer a draft"):
        draft_update(user=owner, job_id=job.id, prompt="new", provider=None, settings_={})
    assert Job.objects.get(id=job.id).prompt == job.prompt


def test_another_users_draft_cannot_be_edited(client, outsider, project):
    [job] = make_drafts(project, 1)
    client.force_login(outsider)
    assert client.get(f"/projects/{project.id}/drafts/{job.id}/edit").status_code == 404
    assert client.post(f"/projects/{project.id}/drafts/{job.id}/edit", {"prompt": "mine"}).status_code == 404
    assert Job.objects.get(id=job.id).prompt == job.prompt


def test_duplicate_copies_prompt_settings_and_references(signed_in, owner, project):
    sha = reference_store(owner, png_bytes())
    [job] = make_drafts(project, 1, quality="high", references=[f"ref:{sha}"])
    body = fetch_post(signed_in, f"/projects/{project.id}/drafts/duplicate", {"job": [str(job.id)]})
    assert body["messages"][0]["text"] == "1 draft(s) duplicated"
    copy = Job.objects.exclude(id=job.id).get()
    assert (copy.prompt, copy.quality, copy.references, copy.status) == (job.prompt, "high", [f"ref:{sha}"], Status.DRAFT)


@pytest.mark.parametrize("action", ["delete", "duplicate"])
def test_an_action_with_nothing_ticked_says_so_and_changes_nothing(signed_in, project, action):
    make_drafts(project, 2)
    body = fetch_post(signed_in, f"/projects/{project.id}/drafts/{action}", {})
    assert body["messages"] == [{"level": "error", "text": f"select drafts first: nothing was {action}d"}]
    assert Job.objects.count() == 2


def test_the_drafts_list_pages_through_every_draft(signed_in, project):
    make_drafts(project, 120)
    first = signed_in.get(f"/projects/{project.id}/")
    assert len(first.context["drafts"]) == 50
    assert first.context["drafts_page"].paginator.num_pages == 3
    last = signed_in.get(f"/projects/{project.id}/", {"drafts_page": "3", "fragment": "1"})
    assert [job.prompt for job in last.context["drafts"]][-1] == "a red fox 119"
    assert "Select all 120 drafts" in first.content.decode()


def test_select_all_across_pages_deletes_every_draft_and_only_drafts(signed_in, project):
    make_drafts(project, 120)
    [started] = make_drafts(project, 1, prompt="running")
    Job.objects.filter(id=started.id).update(status=Status.PENDING)
    body = fetch_post(signed_in, f"/projects/{project.id}/drafts/delete", {"all": "1"})
    assert body["messages"][0]["text"] == "120 draft(s) deleted"
    assert list(Job.objects.values_list("status", flat=True)) == [Status.PENDING]


# --- Provider and model per draft ---------------------------------------------------------


def test_a_draft_takes_its_own_provider_with_that_familys_default_model(signed_in, owner, project):
    other = make_provider(owner, name="OpenAI", family="openai")
    fetch_post(signed_in, f"/projects/{project.id}/drafts", {"prompt": "a fox", "quantity": "1", "provider": str(other.id)})
    job = Job.objects.get()
    assert job.provider_id == other.id and job.model.startswith("gpt-image")


def test_the_provider_select_follows_the_choice_and_lists_only_families_of_the_projects_kind(signed_in, owner, project):
    google = make_provider(owner, name="Gemini", family="google")
    html = signed_in.get(f"/projects/{project.id}/drafts/options", {"provider": str(google.id)}).content.decode()
    assert f'value="{google.id}" selected' in html
    assert "gemini" in html.lower()  # its models replace the demo ones
    assert "demo-image" not in html
    songs = make_project(owner, None, name="Songs", kind="audio")
    html = signed_in.get(f"/projects/{songs.id}/drafts/options").content.decode()
    assert "Gemini" not in html  # Gemini makes no audio
    assert f'value="{project.provider_id}"' in html  # the demo family does


def test_a_provider_of_another_user_or_the_wrong_kind_is_refused(owner, outsider, project):
    theirs = make_provider(outsider, name="Theirs")
    with pytest.raises(ServiceError, match="provider not found"):
        jobs_create_drafts(user=owner, project=project, prompt="x", provider=theirs)
    audio_project = make_project(owner, None, name="Songs", kind="audio")
    replicate = make_provider(owner, name="Rep", family="civitai")
    with pytest.raises(ServiceError, match="does not make audio outputs"):
        jobs_create_drafts(user=owner, project=audio_project, prompt="x", provider=replicate)
    assert not Job.objects.exists()


def test_the_page_refuses_a_model_the_chosen_provider_does_not_offer(signed_in, owner, project):
    other = make_provider(owner, name="OpenAI", family="openai")
    body = fetch_post(
        signed_in,
        f"/projects/{project.id}/drafts",
        {"prompt": "a fox", "quantity": "1", "provider": str(other.id), "model": "demo-image"},
    )
    assert body["created"] == 0 and "not offered by this provider" in body["messages"][0]["text"]


def test_the_resolved_snapshot_uses_the_drafts_provider(owner, project, inline_tasks):
    other = make_provider(owner, name="Second demo")
    jobs_create_drafts(user=owner, project=project, prompt="x", provider=other)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    job = Job.objects.get()
    assert job.status == Status.COMPLETED and job.resolved["provider_id"] == other.id


# --- In a browser -------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.processes
def test_typing_survives_a_model_change_and_a_save_and_a_reference_uploads_by_the_file_input(owner, tmp_path, chromium):
    from tests import procs
    from tests.test_browser import log_in

    provider = make_provider(owner)
    project = make_project(owner, provider, name="Typing")
    picture = tmp_path / "fox.png"
    picture.write_bytes(png_bytes())
    web = procs.daphne(tmp_path / "logs")
    try:
        page = chromium.new_page()
        page.set_default_timeout(30_000)
        log_in(page, web.url, owner)
        page.goto(f"{web.url}/projects/{project.id}/")
        page.evaluate("window.__sameDocument = 'yes'")
        page.fill("#draft-form textarea[name=prompt]", "a fox\nan owl")
        page.select_option("#draft-form select[name=model]", "demo-layers")
        swapped = "#draft-form select[name=model] option[value=demo-layers][selected]"
        page.wait_for_function(f"!!document.querySelector('{swapped}')")
        assert page.input_value("#draft-form textarea[name=prompt]") == "a fox\nan owl"
        assert page.evaluate("window.__sameDocument") == "yes"
        page.check("#per-line")
        page.set_input_files("#draft-form input[name=reference_files]", str(picture))
        # the save is held back until the user has typed more, however slow the machine is
        held = []
        page.route("**/drafts", lambda route: held.append(route))
        page.click("#draft-form button[type=submit]")
        page.type("#draft-form textarea[name=prompt]", " and a hare")
        for _ in range(600):  # the held save reaches the route handler while the page is driven
            if held:
                break
            page.wait_for_timeout(50)
        held[0].continue_()
        page.wait_for_function("document.querySelectorAll('#drafts tr[data-job] img.ref-thumb').length === 2")
        assert page.input_value("#draft-form textarea[name=prompt]") == "a fox\nan owl and a hare"
    finally:
        web.stop()
    jobs = list(Job.objects.filter(project=project).order_by("prompt"))
    [reference] = Reference.objects.filter(owner=owner)
    assert [(job.prompt, job.model, job.references) for job in jobs] == [
        ("a fox", "demo-layers", [f"ref:{reference.sha256}"]),
        ("an owl", "demo-layers", [f"ref:{reference.sha256}"]),
    ]


# --- The API of one draft -----------------------------------------------------------------


@pytest.fixture
def api(client, owner):
    from queue_app.web import tokens

    _, raw = tokens.token_create(user=owner, name="t")

    def call(method, url, body=None):
        return getattr(client, method)(url, body or {}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")

    return call


def test_the_api_edits_only_the_keys_sent_and_deletes_a_draft(api, owner, project):
    [job] = make_drafts(project, 1, quality="high", aspect_ratio="16:9")
    response = api("patch", f"/api/drafts/{job.id}", {"prompt": "an owl", "aspect_ratio": "1:1"})
    assert response.status_code == 200, response.json()
    assert response.json()["prompt"] == "an owl" and response.json()["settings"]["quality"] == "high"
    job.refresh_from_db()
    assert (job.prompt, job.aspect_ratio, job.quality) == ("an owl", "1:1", "high")
    other = make_provider(owner, name="Gemini", family="google")
    response = api("patch", f"/api/drafts/{job.id}", {"provider_id": other.id})
    job.refresh_from_db()
    assert job.provider_id == other.id and job.model.startswith("gemini")  # that family's default model
    assert api("delete", f"/api/drafts/{job.id}").json() == {"deleted": 1}
    assert not Job.objects.exists()


def test_the_api_refuses_bad_draft_edits_with_a_reason_and_changes_nothing(api, outsider, project):
    [job] = make_drafts(project, 1)
    for body, code, says in [
        ({"colour": "red"}, 400, "unknown field(s): colour"),
        ({"prompt": ""}, 400, "a prompt is required"),
        ({"references": ["ref:" + "a" * 64]}, 400, "no uploaded image"),
        ({"provider_id": make_provider(outsider, name="Theirs").id}, 404, "provider not found"),
    ]:
        response = api("patch", f"/api/drafts/{job.id}", body)
        assert (response.status_code, says in response.json()["error"]) == (code, True), response.json()
    Job.objects.filter(id=job.id).update(status=Status.PENDING)
    assert api("patch", f"/api/drafts/{job.id}", {"prompt": "x"}).status_code == 409
    assert api("delete", f"/api/drafts/{job.id}").status_code == 409
    assert Job.objects.get(id=job.id).prompt == job.prompt
