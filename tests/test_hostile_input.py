"""Hostile input against the pages and API of the projects wave: a NUL character, which
PostgreSQL stores in no text or jsonb column, is a clear error everywhere — never a 500 —
and nothing changes."""

import json

import pytest

from queue_app.models import Job, Project
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def draft(client, owner):
    client.force_login(owner)
    project = make_project(owner, make_provider(owner))
    [draft] = make_drafts(project, 1)
    return draft


def test_a_nul_in_a_prompt_on_the_draft_pages_is_a_clear_error_and_changes_nothing(client, draft):
    edited = client.post(f"/projects/{draft.project_id}/drafts/{draft.id}/edit", {"prompt": "a\x00b"})
    assert edited.status_code == 200 and b"NUL character" in edited.content
    draft.refresh_from_db()
    assert "\x00" not in draft.prompt
    client.post(f"/projects/{draft.project_id}/drafts", {"prompt": "c\x00d"})
    assert [job.prompt for job in Job.objects.all()] == [draft.prompt]


@pytest.mark.parametrize(
    "method,url,body",
    [
        ("patch", "/api/drafts/{draft}", {"prompt": "a\u0000b"}),
        ("post", "/api/projects", {"name": "a\u0000b", "kind": "image"}),
        ("patch", "/api/projects/{project}", {"name": "ok", "settings": {"style": "x\u0000"}}),
    ],
)
def test_a_nul_in_any_string_of_an_api_body_is_a_400(client, draft, method, url, body):
    url = url.format(draft=draft.id, project=draft.project_id)
    response = getattr(client, method)(url, data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400 and "NUL character" in response.json()["error"]
    assert [job.prompt for job in Job.objects.all()] == [draft.prompt]
    assert list(Project.objects.values_list("name", flat=True)) == [draft.project.name]


# --- per-user caps on what fans out ---------------------------------------------------------


def test_push_subscriptions_are_capped_per_user_with_a_clear_error(client, owner, settings):
    from queue_app import limits
    from queue_app.models import PushSubscription
    from tests.fakes.push_service import Device, PushService

    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    client.force_login(owner)
    with PushService() as service:
        devices = [Device(service.endpoint(f"browser-{n}")) for n in range(limits.PUSH_SUBSCRIPTIONS + 1)]
        for device in devices[:-1]:
            body = json.dumps(device.subscription_info())
            assert client.post("/push/subscribe", data=body, content_type="application/json").status_code == 200
        extra = client.post("/push/subscribe", data=json.dumps(devices[-1].subscription_info()), content_type="application/json")
        assert extra.status_code == 400 and "switch one off" in extra.json()["error"]
        # a browser already subscribed re-subscribes (an update, not one more)
        again = client.post("/push/subscribe", data=json.dumps(devices[0].subscription_info()), content_type="application/json")
        assert again.status_code == 200
    assert PushSubscription.objects.filter(user=owner).count() == limits.PUSH_SUBSCRIPTIONS


def test_api_tokens_are_capped_per_user_with_a_clear_error(client, owner):
    from queue_app import limits
    from queue_app.models import ApiToken

    client.force_login(owner)
    for n in range(limits.API_TOKENS + 1):
        client.post("/account/tokens", {"name": f"t{n}"})
    assert ApiToken.objects.filter(owner=owner).count() == limits.API_TOKENS
    page = client.get("/account/").content.decode()
    assert f"at most {limits.API_TOKENS} tokens" in page


def test_comfyui_allowed_hosts_are_capped(client, staff, monkeypatch):
    from comfy_app.models import ComfyAllowedHost
    from queue_app import limits

    monkeypatch.setattr(limits, "COMFY_ALLOWED_HOSTS", 3)
    client.force_login(staff)
    for n in range(5):
        client.post("/comfy/allowed-hosts/", {"address": f"192.168.1.{n}:8188", "allow_http": "1"})
    assert ComfyAllowedHost.objects.count() == 3
    page = client.get("/comfy/allowed-hosts/", follow=True)
    admin_add = client.post("/admin/comfy_app/comfyallowedhost/add/", {"address": "10.9.9.9", "allow_http": "on"})
    assert admin_add.status_code == 200 and b"at most 3 hosts" in admin_add.content
    assert ComfyAllowedHost.objects.count() == 3 and page.status_code == 200


# --- deeply nested JSON, wherever JSON comes in ----------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 5000 + "1" + "}" * 5000


@pytest.mark.parametrize("field", ["workflow", "bindings"])
@pytest.mark.parametrize("text", [DEEP, DEEP_OBJECT])
def test_deep_json_in_a_comfyui_form_field_is_a_form_error(owner, field, text):
    from django.test import Client

    client = Client(raise_request_exception=False)
    client.force_login(owner)
    project = Project.objects.create(owner=owner, name="C", kind="comfyui")
    response = client.post(f"/projects/{project.id}/comfyui/", {field: text})
    assert response.status_code == 200 and b"nested" in response.content


@pytest.mark.parametrize("text", [DEEP, DEEP_OBJECT])
def test_a_deep_uploaded_workflow_file_is_a_form_error(owner, text):
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import Client

    client = Client(raise_request_exception=False)
    client.force_login(owner)
    project = Project.objects.create(owner=owner, name="C", kind="comfyui")
    upload = SimpleUploadedFile("workflow.json", text.encode(), content_type="application/json")
    response = client.post(f"/projects/{project.id}/comfyui/", {"workflow_file": upload})
    assert response.status_code == 200 and b"nested" in response.content


@pytest.mark.parametrize("url", ["/push/subscribe", "/push/status", "/push/test", "/push/unsubscribe"])
def test_deep_json_on_the_push_endpoints_is_a_refusal(owner, url):
    from django.test import Client

    client = Client(raise_request_exception=False)
    client.force_login(owner)
    response = client.post(url, data=DEEP, content_type="application/json")
    assert 400 <= response.status_code < 500 or response.json().get("ok") is True or "subscribed" in response.json()


@pytest.mark.parametrize("field", ["options", "model_aliases"])
def test_deep_json_in_an_admin_json_field_is_a_form_error(staff, field):
    from django.test import Client

    from queue_app.models import Provider

    client = Client(raise_request_exception=False)
    client.force_login(staff)
    fields = {"owner": staff.id, "name": "Deep", "family": "demo", "options": "{}", "model_aliases": "{}"}
    fields.update(concurrency=1, max_attempts=2, **{field: DEEP})
    response = client.post("/admin/queue_app/provider/add/", fields)
    assert response.status_code == 200 and b"nested" in response.content
    assert not Provider.objects.filter(name="Deep").exists()


def test_a_deep_mcp_cursor_is_a_tool_error(owner):
    import base64

    from django.test import Client

    from queue_app.web import tokens

    raw = tokens.token_create(user=owner, name="mcp")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", raise_request_exception=False)
    cursor = base64.urlsafe_b64encode(DEEP.encode()).decode()
    params = {"name": "list_projects", "arguments": {"cursor": cursor}}
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    response = client.post("/mcp", data=json.dumps(message), content_type="application/json")
    assert response.status_code < 500


# --- addresses are a scheme, host, port and path prefix ------------------------------------

NOT_AN_ADDRESS = [
    ("https://api.example.com/v1?key=x", "no query"),
    ("https://api.example.com/v1?", "no query"),
    ("https://api.example.com/v1#frag", "no fragment"),
    ("https://user:pw@api.example.com/v1", "user:password@"),
    ("https://user@api.example.com/v1", "user:password@"),
]


@pytest.mark.parametrize("url,said", NOT_AN_ADDRESS)
def test_a_provider_address_with_a_query_fragment_or_userinfo_is_refused(client, owner, monkeypatch, url, said):
    from queue_app.models import Provider
    from tests.fakes.dns import use_fake_dns

    use_fake_dns(monkeypatch)
    client.force_login(owner)
    body = {"name": "P", "family": "openai", "api_key": "sk-" + "1" * 30, "base_url": url}
    created = client.post("/api/providers", data=json.dumps(body), content_type="application/json")
    assert created.status_code == 400 and said in created.json()["error"]
    page = client.post("/providers/new", {**body, "concurrency": 1, "max_attempts": 2})
    assert page.status_code == 200 and said in page.content.decode()
    assert not Provider.objects.exists()
    assert (
        client.post(
            "/api/providers", data=json.dumps({**body, "base_url": "https://api.example.com/v1"}), content_type="application/json"
        ).status_code
        == 201
    )


@pytest.mark.parametrize("url,said", NOT_AN_ADDRESS)
def test_a_comfyui_address_with_a_query_fragment_or_userinfo_is_refused(client, owner, monkeypatch, url, said):
    from comfy_app.models import ComfyInstance
    from tests.fakes.dns import use_fake_dns

    use_fake_dns(monkeypatch)
    client.force_login(owner)
    project = Project.objects.create(owner=owner, name="C", kind="comfyui")
    saved = client.post(f"/projects/{project.id}/comfyui/", {"base_url": url})
    assert saved.status_code == 200 and said in saved.content.decode()
    assert not ComfyInstance.objects.filter(project=project).exclude(base_url="").exists()
    tested = client.post(f"/projects/{project.id}/comfyui/test", {"base_url": url}, HTTP_ACCEPT="application/json")
    assert tested.json()["ok"] is False and said in tested.json()["error"]


# --- one set of limits: each reachable through the door that claims it ----------------------


def test_the_monitor_takes_as_many_selected_jobs_as_its_bulk_limit(client, owner):
    import uuid

    from queue_app import limits

    client.force_login(owner)
    ids = [str(uuid.uuid4()) for _ in range(limits.BULK_SELECTED)]
    form = {"op": "cancel:selected", "job_ids": ids, "state": "all", "next": "/queue/"}
    response = client.post("/queue/jobs/bulk", form)
    assert response.status_code == 200 and b"confirm" in response.content.lower()
