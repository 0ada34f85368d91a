"""Viewing is not acting: a staff account without permissions (the read-only operator)
sees everyone's projects, jobs and providers, and acts on none of them — no page, API
endpoint, MCP tool, monitor bulk action, admin action or ComfyUI setting lets it draft,
start, cancel, retry, clear, test another user's secret or change a global setting. The
Django permission for the act lets an operator act; a stored secret only ever goes to the
address it was saved for."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from comfy_app.models import ComfyAllowedHost, ComfyInstance
from queue_app.models import ErrorClass, Job, Status
from queue_app.web import tokens
from tests.factories import make_drafts, make_job, make_project, make_provider, make_user
from tests.test_security import state, state_without_tokens, url_patterns

pytestmark = pytest.mark.django_db

BCRYPT = "$2b$12$" + "a" * 53  # a bcrypt hash: the ComfyUI client sends it as a Bearer token


class _Capture(BaseHTTPRequestHandler):
    """Any address a user might aim a test at: records every request's headers."""

    seen: list

    def _any(self):
        self.seen.append(dict(self.headers))
        body = json.dumps({"system": {"comfyui_version": "0"}, "devices": [{"name": "cpu"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _any

    def log_message(self, *args):
        pass


@pytest.fixture
def capture(settings):
    handler = type("Capture", (_Capture,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    settings.OUTBOUND_ALLOWLIST = [f"http://127.0.0.1:{server.server_address[1]}"]
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def viewer(django_user_model):
    """Staff, no permissions: the read-only operator."""
    return make_user(django_user_model, "viewer", is_staff=True)


@pytest.fixture
def world(owner, capture):
    url, _ = capture
    billed = make_provider(owner, name="Billed", concurrency=2)
    # A key whose test would reach the capturing server: nobody but its owner may send it.
    provider = make_provider(owner, name="Keyed", family="openai", concurrency=2)
    provider.api_key = "sk-OWNER-" + "9" * 30
    provider.base_url = f"{url}/v1"
    provider.save()
    paused = make_provider(owner, name="Paused", concurrency=1)
    paused.paused = True
    paused.save()
    project = make_project(owner, billed, name="Theirs")
    draft, other = make_drafts(project, 2)
    failed = make_job(project, Status.FAILED, error="down", error_class="transient")
    held = make_job(project, Status.FAILED, error="maybe accepted", error_class=ErrorClass.ATTENTION)
    pending = make_job(project, Status.PENDING, provider=paused)
    comfy = make_project(owner, name="Their ComfyUI", kind="comfyui")
    instance = ComfyInstance.objects.create(project=comfy, base_url=url)
    instance.password = BCRYPT
    instance.save()
    return dict(provider=provider, project=project, draft=draft, failed=failed, held=held, pending=pending, comfy=comfy)


def ids_of(world) -> list[str]:
    return [str(world[name].id) for name in ("draft", "failed", "held", "pending")]


def form_for(world) -> dict:
    """Every field any page's action reads, aimed at the owner's rows, confirmed."""
    return {
        "prompt": "spend their money",
        "quantity": "1",
        "all": "1",
        "job": ids_of(world),
        "job_ids": ids_of(world),
        "only": str(world["pending"].id),
        "confirm": "1",
        "scope": "project",
        "project": str(world["project"].id),
        "provider": str(world["provider"].id),
        "concurrency": "7",
        "state": "all",
        "name": "renamed",
        "family": "demo",
        "base_url": "http://127.0.0.1:1/",
        "address": "10.0.0.1:8188",
        "archived": "1",
        "action": "test",
        "workflow": "",
        "bindings": "",
    }


ACTION_VALUES = {
    "queue/providers/<int:provider_id>/<str:action>": ["pause", "resume", "concurrency", "clear-cooldown"],
    "queue/failed/<str:action>": ["retry", "clear"],
    "queue/attention/<str:action>": ["resubmit", "mark-failed"],
}
# The viewer's own account: acting on it is theirs to do.
OWN_ACCOUNT = ("accounts/", "account/", "push/")


def every_post(world):
    """(url, extra form fields) for every route of the site with the owner's ids filled in."""
    values = {
        "project_id": world["project"].id,
        "provider_id": world["provider"].id,
        "job_id": world["draft"].id,
        "item_id": 1,
        "token_id": 1,
    }
    for route, _, _ in url_patterns():
        if route.startswith(OWN_ACCOUNT):
            continue
        for action in ACTION_VALUES.get(route, [""]):
            url = "/" + route
            for name, value in {**values, "action": action}.items():
                for converter in ("int", "uuid", "str"):
                    url = url.replace(f"<{converter}:{name}>", str(value))
            if "<" in url:
                continue  # a route keyed by something else (a reference's sha256): GET only
            yield url
    comfy = world["comfy"].id
    yield f"/projects/{comfy}/comfyui/"
    yield f"/projects/{comfy}/comfyui/test"


BULK_OPS = ["retry:selected", "clear:selected", "cancel:selected", "retry:matching", "clear:matching", "cancel:matching"]


def test_a_staff_account_without_permissions_changes_nothing_through_any_page(world, viewer, capture):
    _, seen = capture
    client = Client(raise_request_exception=False)
    client.force_login(viewer)
    before = state()
    for url in every_post(world):
        ops = BULK_OPS if url.startswith("/queue/jobs/bulk") else [""]
        for op in ops:
            response = client.post(url, {**form_for(world), "op": op})
            assert response.status_code < 500, (url, op, response.status_code)
            client.post(url, data=json.dumps({"all_drafts": True, "prompt": "x"}), content_type="application/json")
    assert state() == before
    assert seen == [], "a key or password test was sent with the owner's stored secret"


def test_the_pages_say_403_to_the_viewer_and_show_their_rows(client, world, viewer):
    client.force_login(viewer)
    project = world["project"]
    assert client.get(f"/projects/{project.id}/").status_code == 200
    assert client.get(f"/jobs/{world['failed'].id}/").status_code == 200
    for url in (f"/projects/{project.id}/start", f"/projects/{project.id}/drafts", f"/jobs/{world['failed'].id}/retry"):
        assert client.post(url, {"all": "1", "prompt": "x"}).status_code == 403, url
    assert Job.objects.filter(project=project).count() == 5


def api_calls(world):
    project, provider = world["project"], world["provider"]
    return [
        ("post", f"/api/projects/{project.id}/drafts", {"prompt": "x"}),
        ("post", f"/api/projects/{project.id}/start", {"all_drafts": True}),
        ("post", "/api/jobs/retry", {"job_ids": [str(world["failed"].id)]}),
        ("post", "/api/jobs/cancel", {"job_ids": [str(world["pending"].id)]}),
        ("post", "/api/queue/clear-failed", {"project_id": project.id}),
        ("post", "/api/queue/retry-failed", {"provider_id": provider.id}),
        ("post", f"/api/providers/{provider.id}", {"paused": True}),
        ("patch", f"/api/providers/{provider.id}", {"concurrency": 9}),
        ("delete", f"/api/providers/{provider.id}", None),
        ("post", f"/api/providers/{provider.id}/test", {}),
        ("patch", f"/api/projects/{project.id}", {"name": "mine now"}),
        ("delete", f"/api/projects/{project.id}", None),
        ("patch", f"/api/drafts/{world['draft'].id}", {"prompt": "x"}),
        ("delete", f"/api/drafts/{world['draft'].id}", None),
    ]


def test_the_api_refuses_every_act_on_another_users_rows_with_403_or_404(world, viewer):
    raw = tokens.token_create(user=viewer, name="viewer")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", raise_request_exception=False)
    before = state_without_tokens()
    for method, url, body in api_calls(world):
        data = json.dumps(body) if body is not None else ""
        response = getattr(client, method)(url, data=data, content_type="application/json")
        assert response.status_code in (403, 404), (method, url, response.status_code, response.content[:200])
        assert response.json()["error"], url
    # Unscoped clears and retries act on the viewer's own (none), never everyone's.
    assert client.post("/api/queue/clear-failed", data="{}", content_type="application/json").json()["cleared"] == 0
    assert client.post("/api/queue/retry-failed", data="{}", content_type="application/json").json()["retried"] == 0
    assert state_without_tokens() == before
    # …while it sees them all.
    assert client.get(f"/api/projects/{world['project'].id}/jobs").status_code == 200


def test_the_mcp_tools_refuse_every_act_on_another_users_rows(world, viewer):
    raw = tokens.token_create(user=viewer, name="viewer")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    project, provider = world["project"], world["provider"]
    calls = [
        ("create_drafts", {"project_id": project.id, "prompt": "x"}),
        ("start_jobs", {"project_id": project.id, "all_drafts": True}),
        ("retry_jobs", {"job_ids": [str(world["failed"].id)]}),
        ("cancel_jobs", {"job_ids": [str(world["pending"].id)]}),
        ("clear_failed_jobs", {"project_id": project.id}),
        ("retry_failed_jobs", {"provider_id": provider.id}),
        ("save_provider", {"provider_id": provider.id, "paused": True}),
        ("save_provider", {"provider_id": world["pending"].provider_id, "paused": False}),
        ("save_provider", {"provider_id": provider.id, "concurrency": 5}),
        ("delete", {"kind": "provider", "id": provider.id}),
    ]
    before = state_without_tokens()
    for n, (tool, arguments) in enumerate(calls):
        message = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
        result = client.post("/mcp", data=json.dumps(message), content_type="application/json").json()["result"]
        assert result["isError"] and "not act on" in result["content"][0]["text"], (tool, result)
    assert state_without_tokens() == before


def test_an_operator_with_the_permission_acts(world, viewer):
    viewer.user_permissions.add(Permission.objects.get(codename="change_job"))
    raw = tokens.token_create(user=viewer, name="operator")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = json.dumps({"job_ids": [str(world["pending"].id)]})
    response = client.post("/api/jobs/cancel", data=body, content_type="application/json")
    assert response.status_code == 200 and response.json()["cancelled"] == 1
    assert Job.objects.get(id=world["pending"].id).status == Status.FAILED


def test_an_admin_action_needs_the_change_permission(client, world, viewer):
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))  # a read-only operator in the admin
    client.force_login(viewer)
    assert client.get("/admin/queue_app/job/").status_code == 200
    response = client.post(
        "/admin/queue_app/job/", {"action": "start_or_retry", "_selected_action": [str(world["draft"].id)], "index": 0}
    )
    assert response.status_code in (200, 302)
    assert Job.objects.get(id=world["draft"].id).status == Status.DRAFT


def test_the_global_comfyui_allowed_hosts_need_their_permission(client, viewer):
    client.force_login(viewer)
    assert client.get("/comfy/allowed-hosts/").status_code == 200  # staff see the list
    client.post("/comfy/allowed-hosts/", {"address": "169.254.169.254", "allow_http": "1"})
    assert not ComfyAllowedHost.objects.exists()
    viewer.user_permissions.add(Permission.objects.get(codename="add_comfyallowedhost"))
    client.post("/comfy/allowed-hosts/", {"address": "192.168.1.20:8188", "allow_http": "1"})
    assert list(ComfyAllowedHost.objects.values_list("address", flat=True)) == ["192.168.1.20:8188"]


def test_a_stored_comfyui_password_only_goes_to_the_address_it_was_saved_for(client, owner, world, capture, settings):
    saved, seen = capture
    elsewhere = Capture2()
    try:
        settings.OUTBOUND_ALLOWLIST = [saved, elsewhere.url]
        client.force_login(owner)
        comfy = world["comfy"].id
        tested = client.post(f"/projects/{comfy}/comfyui/test", {"base_url": elsewhere.url}, HTTP_ACCEPT="application/json")
        assert tested.json()["ok"] is True  # the other address was reached…
        assert elsewhere.seen and all(BCRYPT not in json.dumps(headers) for headers in elsewhere.seen)  # …without it
        client.post(f"/projects/{comfy}/comfyui/test", {}, HTTP_ACCEPT="application/json")
        assert any(headers.get("Authorization") == f"Bearer {BCRYPT}" for headers in seen)  # the saved one gets it
    finally:
        elsewhere.close()


class Capture2:
    def __init__(self):
        handler = type("Capture", (_Capture,), {"seen": []})
        self.seen = handler.seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_stored_provider_key_never_follows_a_new_family_or_address(client, owner, world, staff, monkeypatch):
    from tests.fakes.dns import use_fake_dns

    use_fake_dns(monkeypatch)
    client.force_login(owner)
    provider = make_provider(owner, name="Default address", family="openai")  # its key goes to api.openai.com
    provider.api_key = "sk-OWNER-" + "8" * 30
    provider.save()
    before = (provider.family, provider.base_url)
    for body in ({"family": "replicate"}, {"base_url": "https://proxy.example.com/v1"}):
        response = client.patch(f"/api/providers/{provider.id}", data=json.dumps(body), content_type="application/json")
        assert response.status_code == 400 and "enter the API key again" in response.json()["error"], body
    client.force_login(staff)  # the admin too, for whoever may change it there
    fields = {"owner": owner.id, "name": provider.name, "family": "replicate", "base_url": ""}
    fields.update(options="{}", model_aliases="{}", concurrency=2, max_attempts=2)
    response = client.post(f"/admin/queue_app/provider/{provider.id}/change/", fields)
    assert response.status_code == 200 and b"enter the API key again" in response.content
    provider.refresh_from_db()
    assert (provider.family, provider.base_url) == before


def test_a_stored_comfyui_password_never_follows_a_new_address_in_the_admin(client, world, staff, monkeypatch):
    from tests.fakes.dns import use_fake_dns

    use_fake_dns(monkeypatch)
    instance = ComfyInstance.objects.get(project=world["comfy"])
    client.force_login(staff)
    fields = {"project": world["comfy"].id, "base_url": "https://comfy.example.com", "workflow": "{}", "bindings": "[]"}
    response = client.post(f"/admin/comfy_app/comfyinstance/{instance.id}/change/", fields)
    assert response.status_code == 200 and b"enter the password again" in response.content
    instance.refresh_from_db()
    assert instance.base_url != "https://comfy.example.com" and instance.password == BCRYPT


def test_the_project_services_refuse_a_non_owner_even_when_a_door_forgets_to(world, viewer):
    from queue_app.services.errors import ServiceError
    from queue_app.services.projects import project_delete, project_set_archived, project_update

    project = world["project"]
    for write in (
        lambda: project_update(user=viewer, project=project, data={"name": "mine"}),
        lambda: project_set_archived(user=viewer, project=project, archived=True),
        lambda: project_delete(user=viewer, project=project),
    ):
        with pytest.raises(ServiceError):
            write()
    project.refresh_from_db()
    assert (project.name, project.archived) == ("Theirs", False)


def test_a_token_of_a_deactivated_account_opens_nothing(world, owner):
    raw = tokens.token_create(user=owner, name="old laptop")[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/projects").status_code == 200
    owner.is_active = False
    owner.save()
    assert client.get("/api/projects").status_code == 401
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_projects", "arguments": {}}}
    assert client.post("/mcp", data=json.dumps(message), content_type="application/json").status_code == 401
