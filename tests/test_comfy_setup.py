"""Setting up a ComfyUI project as a new user would: a local instance allowed by staff (in
the app, at once, for ComfyUI only), "Test connection" on what the form holds without
losing it, an uploaded exported workflow, and the bindings picker."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from comfy_app import services, setup
from comfy_app.models import ComfyAllowedHost, ComfyInstance
from queue_app.providers import net
from queue_app.services.errors import ServiceError
from tests.conftest import make_project
from tests.fakes.comfyui import WORKFLOW, FakeComfyUI

pytestmark = pytest.mark.django_db


@pytest.fixture
def comfy_project(owner):
    return make_project(owner, kind="comfyui", name="Comfy")


@pytest.fixture
def local_fake(settings):
    """A ComfyUI on 127.0.0.1 with no environment allowlist: how most people run it."""
    settings.OUTBOUND_ALLOWLIST = []
    settings.OUTBOUND_ALLOW_HTTP = False
    server = FakeComfyUI().start()
    yield server
    server.stop()


def settings_url(project) -> str:
    return f"/projects/{project.id}/comfyui/"


def test_a_local_address_is_refused_with_where_staff_can_allow_it(client, owner, comfy_project, local_fake):
    client.force_login(owner)
    page = client.post(settings_url(comfy_project), {"base_url": local_fake.url, "workflow": json.dumps(WORKFLOW)})
    text = page.content.decode()
    assert page.status_code == 200 and "ComfyUI → Allowed hosts" in text and "/comfy/allowed-hosts/" in text
    assert text.count("only https URLs are allowed") == 1
    assert ComfyInstance.objects.get(project=comfy_project).base_url == ""


def test_staff_allow_a_local_host_in_the_app_and_it_works_at_once_for_comfyui_only(
    client, owner, staff, comfy_project, local_fake
):
    client.force_login(staff)
    assert client.get("/comfy/allowed-hosts/").status_code == 200
    client.post("/comfy/allowed-hosts/", {"address": f"http://127.0.0.1:{local_fake.port}/", "note": "the studio PC"})
    host = ComfyAllowedHost.objects.get()
    assert (host.address, host.allow_http) == (f"127.0.0.1:{local_fake.port}", True)
    client.force_login(owner)
    saved = client.post(settings_url(comfy_project), {"base_url": local_fake.url, "workflow": json.dumps(WORKFLOW)})
    assert saved.status_code == 302 and ComfyInstance.objects.get(project=comfy_project).base_url == local_fake.url
    result = services.comfy_test_connection(user=owner, project=comfy_project)
    assert result["ok"] and result["version"] == "0.3.64"
    # the SSRF guard stays for everything else: not a provider's, a download's or a push's host
    with pytest.raises(net.UnsafeURL):
        net.check_url(local_fake.url + "/view")
    # removed: refused again at once
    client.force_login(staff)
    client.post("/comfy/allowed-hosts/", {"remove": host.id})
    assert not services.comfy_test_connection(user=owner, project=comfy_project)["ok"]


def test_only_staff_can_allow_hosts(client, owner):
    client.force_login(owner)
    assert client.get("/comfy/allowed-hosts/").status_code == 404
    assert client.post("/comfy/allowed-hosts/", {"address": "10.0.0.5:8188"}).status_code == 404
    with pytest.raises(ServiceError):
        services.allowed_host_add(user=owner, address="10.0.0.5:8188")
    assert not ComfyAllowedHost.objects.exists()


def test_test_connection_tests_the_form_and_keeps_the_pasted_workflow_and_bindings(client, owner, comfy_project, settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    server = FakeComfyUI().start()
    try:
        client.force_login(owner)
        bindings = [{"source": "prompt", "node": "1", "input": "color", "kind": "number"}]
        form = {"base_url": server.url, "workflow": json.dumps(WORKFLOW), "bindings": json.dumps(bindings), "action": "test"}
        page = client.post(settings_url(comfy_project), form)
    finally:
        server.stop()
    text = page.content.decode()
    assert page.status_code == 200 and 'data-ok="yes"' in text and "Connected to ComfyUI 0.3.64" in text
    assert "ImageInvert" in text and "&quot;color&quot;" in text  # the workflow and the bindings are still in the form
    assert server.url in text
    instance = ComfyInstance.objects.get(project=comfy_project)
    assert instance.base_url == "" and instance.workflow == {}  # nothing saved


def test_an_exported_workflow_file_is_uploaded_and_a_ui_format_file_is_explained(client, owner, comfy_project):
    client.force_login(owner)
    api_file = SimpleUploadedFile("workflow_api.json", json.dumps(WORKFLOW).encode(), content_type="application/json")
    assert client.post(settings_url(comfy_project), {"workflow_file": api_file}).status_code == 302
    assert ComfyInstance.objects.get(project=comfy_project).workflow == WORKFLOW
    ui_file = SimpleUploadedFile("workflow.json", json.dumps({"nodes": [], "links": []}).encode())
    page = client.post(settings_url(comfy_project), {"workflow_file": ui_file})
    assert page.status_code == 200 and "Save (API Format)" in page.content.decode()
    assert ComfyInstance.objects.get(project=comfy_project).workflow == WORKFLOW


def test_the_picker_lists_settable_inputs_and_its_choices_become_bindings(client, owner, comfy_project):
    raw = [{"source": "params.blur", "node": "2", "input": "image", "kind": "number"}]  # a link input: raw JSON only
    services.comfy_settings_save(user=owner, project=comfy_project, base_url="", workflow_json=WORKFLOW, bindings=raw)
    client.force_login(owner)
    page = client.get(settings_url(comfy_project)).content.decode()
    assert 'name="bind:1:width"' in page and 'name="bind:2:image"' not in page  # links are not settable
    form = {"workflow": json.dumps(WORKFLOW), "bindings": json.dumps(raw), "bind:1:width": "width", "bind:1:color": "seed"}
    form.update({"bind:1:height": ""})
    assert client.post(settings_url(comfy_project), form).status_code == 302
    bindings = ComfyInstance.objects.get(project=comfy_project).bindings
    assert {(b["node"], b["input"], b["source"], b["kind"]) for b in bindings} == {
        ("2", "image", "params.blur", "number"),
        ("1", "width", "params.width", "number"),
        ("1", "color", "params.seed", "seed"),
    }
    page = client.get(settings_url(comfy_project)).content.decode()
    assert '<option value="width" selected>' in page


def test_a_picker_choice_replaces_the_raw_binding_of_that_input():
    raw = [{"source": "prompt", "node": "1", "input": "width", "kind": "text"}]
    merged = setup.merge_picker({"bind:1:width": ""}, raw, WORKFLOW)
    assert merged == []
    merged = setup.merge_picker({"bind:1:width": "reference", "bind:9:x": "prompt"}, raw, WORKFLOW)
    assert merged == [{"source": "references.0", "node": "1", "input": "width", "kind": "image"}]
