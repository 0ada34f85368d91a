"""The ComfyUI settings page, its write-only password and the test-connection action."""

import json

import pytest

from comfy_app import services
from comfy_app.models import ComfyInstance
from queue_app.services.errors import ServiceError
from tests.conftest import make_project
from tests.fakes.comfyui import WORKFLOW

pytestmark = pytest.mark.django_db


@pytest.fixture
def comfy_project(owner):
    return make_project(owner, kind="comfyui", name="Comfy")


@pytest.fixture
def fake(fake_comfyui):
    return fake_comfyui


def test_the_owner_saves_settings_and_the_password_is_never_rendered(client, owner, comfy_project, fake):
    client.force_login(owner)
    bindings = [{"source": "params.width", "node": "1", "input": "width", "kind": "number"}]
    response = client.post(
        f"/projects/{comfy_project.id}/comfyui/",
        {"base_url": fake.url, "password": "s3cret-pass", "workflow": json.dumps(WORKFLOW), "bindings": json.dumps(bindings)},
    )
    assert response.status_code == 302
    instance = ComfyInstance.objects.get(project=comfy_project)
    assert instance.password == "s3cret-pass" and "s3cret" not in instance.password_encrypted
    assert instance.workflow == WORKFLOW and instance.bindings == bindings
    page = client.get(f"/projects/{comfy_project.id}/comfyui/").content.decode()
    assert "s3cret-pass" not in page and "Stored password: set" in page
    # a blank password keeps the stored one
    client.post(f"/projects/{comfy_project.id}/comfyui/", {"base_url": fake.url, "workflow": json.dumps(WORKFLOW)})
    assert ComfyInstance.objects.get(project=comfy_project).password == "s3cret-pass"


def test_another_users_project_answers_404(client, outsider, comfy_project):
    client.force_login(outsider)
    assert client.get(f"/projects/{comfy_project.id}/comfyui/").status_code == 404
    assert client.post(f"/projects/{comfy_project.id}/comfyui/test").status_code == 404


def test_a_ui_format_workflow_and_a_binding_to_a_missing_input_are_refused(owner, comfy_project):
    with pytest.raises(ServiceError, match="API Format"):
        services.comfy_settings_save(
            user=owner, project=comfy_project, base_url="", workflow_json={"nodes": [], "links": []}, bindings=[]
        )
    with pytest.raises(ServiceError, match="has no input 'nope'"):
        services.comfy_settings_save(
            user=owner,
            project=comfy_project,
            base_url="",
            workflow_json=WORKFLOW,
            bindings=[{"source": "prompt", "node": "1", "input": "nope"}],
        )


def test_test_connection_reports_version_device_and_free_vram(client, owner, comfy_project, fake):
    ComfyInstance.objects.create(project=comfy_project, base_url=fake.url)
    client.force_login(owner)
    response = client.post(f"/projects/{comfy_project.id}/comfyui/test", HTTP_ACCEPT="application/json")
    result = response.json()
    assert result["ok"] and result["version"] == "0.3.64" and result["device"] == "cpu"
    assert result["vram_free"] == 24229928960
    page = client.post(f"/projects/{comfy_project.id}/comfyui/test", follow=True).content.decode()
    assert "Connected to ComfyUI 0.3.64 on cpu" in page and "GB VRAM free" in page


def test_test_connection_gives_a_readable_error(owner, comfy_project, fake):
    fake.refuse()
    result = services.comfy_test_connection(user=owner, project=comfy_project, base_url=fake.url)
    assert result == {"ok": False, "url": fake.url, "error": f"Cannot reach ComfyUI at {fake.url} (connection refused)"}


def test_a_private_address_is_refused_outside_the_allowlist(owner, comfy_project, settings):
    settings.OUTBOUND_ALLOWLIST = []
    with pytest.raises(ServiceError, match="not allowed"):
        services.comfy_settings_save(
            user=owner, project=comfy_project, base_url="http://10.0.0.5:8188", workflow_json={}, bindings=[]
        )
