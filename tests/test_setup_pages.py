"""What a new user meets while setting up, said and kept: a refused ComfyUI address keeps
the uploaded workflow, "Test connection" answers in place (a reload sends nothing again)
in one sentence, a provider form shown again keeps the typed key, the https refusal names
OUTBOUND_ALLOWLIST and its restart, and staff find Allowed hosts in the navigation."""

import html
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from comfy_app.models import ComfyInstance
from comfy_app.views import connection_text
from queue_app.models import Provider
from queue_app.providers import net
from tests.fakes.comfyui import WORKFLOW
from tests.test_comfy_setup import comfy_project as comfy_project  # noqa: F401  (the fixture)
from tests.test_comfy_setup import local_fake as local_fake  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db


def test_a_refused_address_keeps_the_uploaded_workflow(client, owner, comfy_project, local_fake):
    client.force_login(owner)
    upload = SimpleUploadedFile("workflow_api.json", json.dumps(WORKFLOW).encode(), content_type="application/json")
    page = client.post(f"/projects/{comfy_project.id}/comfyui/", {"base_url": local_fake.url, "workflow_file": upload})
    text = html.unescape(page.content.decode())
    assert page.status_code == 200 and "must first be allowed by staff" in text
    shown = page.context["form"]["workflow"].value()
    assert json.loads(shown) == WORKFLOW  # the file's text is in the form, ready to save again
    assert 'id="bindings-picker"' in text and ComfyInstance.objects.get(project=comfy_project).workflow == {}


def test_test_connection_answers_in_place_in_one_sentence(client, owner, comfy_project, local_fake):
    client.force_login(owner)
    body = {"base_url": local_fake.url, "workflow": json.dumps(WORKFLOW), "action": "test"}
    answer = client.post(f"/projects/{comfy_project.id}/comfyui/", body, headers={"X-Requested-With": "fetch"}).json()
    assert answer["ok"] is False and "must first be allowed by staff" in answer["text"]
    unreachable = {"ok": False, "url": "http://10.1.2.3:8188", "error": "Cannot reach ComfyUI at http://10.1.2.3:8188 (refused)"}
    assert connection_text(unreachable) == "Cannot reach ComfyUI at http://10.1.2.3:8188 (refused)"
    assert (
        connection_text({"ok": False, "url": "http://a", "error": "login failed"}) == "Cannot connect to http://a: login failed"
    )


def test_a_provider_form_shown_again_keeps_the_typed_key(client, owner):
    client.force_login(owner)
    form = {
        "name": "Mine",
        "family": "openai",
        "base_url": "",
        "concurrency": "0",
        "max_attempts": "4",
        "api_key": "sk-typed-12345",
    }
    page = client.post("/providers/new", form)
    assert page.status_code == 200 and not Provider.objects.exists()
    assert 'value="sk-typed-12345"' in page.content.decode()
    assert 'name="api_key"' in client.get("/providers/new").content.decode()


def test_the_https_refusal_names_the_allowlist_and_its_restart(settings):
    settings.OUTBOUND_ALLOWLIST, settings.OUTBOUND_ALLOW_HTTP = [], False
    with pytest.raises(net.UnsafeURL) as refused:
        net.check_url("http://comfy.example.com:8188/")
    assert "OUTBOUND_ALLOWLIST as http://comfy.example.com:8188" in str(refused.value)
    assert "restart" in str(refused.value)


def test_staff_find_allowed_hosts_in_the_navigation(client, owner, staff):
    client.force_login(owner)
    assert 'id="nav-allowed-hosts"' not in client.get("/projects/").content.decode()
    client.force_login(staff)
    assert 'id="nav-allowed-hosts"' in client.get("/projects/").content.decode()
    assert client.get("/comfy/allowed-hosts/").status_code == 200
