"""Small things a new user notices: the account page leads to notification preferences,
families and kinds carry their own names, a ComfyUI job is running (not "detached"),
there is a favicon, disabled buttons look disabled, and the charts say "tap" on a
touchscreen."""

import uuid

import pytest

from queue_app.models import Job, Status
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def test_the_account_page_links_to_notification_preferences(signed_in):
    page = signed_in.get("/account/").content.decode()
    assert 'href="/account/preferences/"' in page and signed_in.get("/account/preferences/").status_code == 200


def test_families_and_kinds_are_said_by_their_own_names(signed_in, owner):
    make_provider(owner, name="Mine", family="openai")
    make_provider(owner, name="Hub", family="runninghub")
    listing = signed_in.get("/providers/").content.decode()
    assert "<td>OpenAI</td>" in listing and "<td>RunningHub</td>" in listing
    form = signed_in.get("/providers/new").content.decode()
    assert '<option value="google">Gemini</option>' in form and "Openai" not in form
    assert '<option value="comfyui">ComfyUI</option>' in signed_in.get("/projects/new").content.decode()


def test_a_comfyui_job_at_its_instance_reads_running(signed_in, owner):
    project = make_project(owner, None, kind="comfyui", name="Comfy")
    [job] = make_drafts(project, 1)
    Job.objects.filter(id=job.id).update(status=Status.PROCESSING, task_id="prompt-1", lease_token=uuid.uuid4())
    row = signed_in.get(f"/projects/{project.id}/").context["queue"][0]
    assert row["state"] == "running"
    assert "ComfyUI ·" in signed_in.get(f"/projects/{project.id}/").content.decode()


def test_the_monitor_counts_a_comfyui_job_at_its_instance_as_running_and_a_remote_task_as_detached(owner, staff):
    from queue_app.selectors.job_list import jobs_after
    from queue_app.selectors.queue import queue_status

    comfy = make_project(owner, None, kind="comfyui", name="Comfy")
    remote = make_project(owner, make_provider(owner, name="Remote"), name="Remote")
    [prompt] = make_drafts(comfy, 1)
    [task] = make_drafts(remote, 1)
    for job, task_id in ((prompt, "prompt-1"), (task, "prediction-1")):
        Job.objects.filter(id=job.id).update(status=Status.PROCESSING, task_id=task_id, lease_token=uuid.uuid4())
    totals = queue_status(user=staff)["totals"]
    assert (totals["running"], totals["detached"], totals["processing"]) == (1, 1, 2)
    assert [row["id"] for row in jobs_after(user=staff, state="running")["jobs"]] == [str(prompt.id)]
    assert [row["id"] for row in jobs_after(user=staff, state="detached")["jobs"]] == [str(task.id)]


def test_a_favicon_and_disabled_buttons_that_look_it(signed_in, client):
    page = signed_in.get("/projects/").content.decode()
    assert 'rel="icon"' in page and "button:disabled" in page
    icon = client.get("/favicon.ico")
    assert icon.status_code == 302 and icon["Location"].endswith("queue_app/favicon.svg")


def test_the_history_says_tap_a_bar_on_a_touchscreen(client, staff):
    client.force_login(staff)
    page = client.get("/queue/").content.decode()
    assert '<span class="hint-tap">(tap a bar)</span>' in page and "@media (hover: none)" in page
