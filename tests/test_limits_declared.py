"""One declared set of limits (queue_app/limits.py), the same at every door: the provider
page, the admin, the Queue Monitor, the JSON API, the MCP tools and the database itself
(issue 18 §2)."""

import json

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import Client

from comfy_app import services as comfy_services
from queue_app import limits
from queue_app.models import Job, Project, Provider
from queue_app.services.errors import ServiceError
from queue_app.services.providers import provider_set_concurrency
from queue_app.web import tokens
from tests.conftest import make_project, make_provider

pytestmark = pytest.mark.django_db

TOO_MANY = limits.CONCURRENCY.high + 1


@pytest.fixture
def token_client(owner):
    _, raw = tokens.token_create(user=owner, name="limits")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def mcp_call(client, name, **arguments):
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    return client.post("/mcp", data=json.dumps(message), content_type="application/json").json()["result"]


def provider_page_post(client, provider, **changes):
    data = {"name": provider.name, "family": provider.family, "base_url": "", "concurrency": 1, "max_attempts": 4, **changes}
    return client.post(f"/providers/{provider.id}/", data)


def admin_post(client, provider, **changes):
    data = {
        "owner": provider.owner_id,
        "name": provider.name,
        "family": provider.family,
        "base_url": "",
        "options": json.dumps(provider.options),
        "concurrency": provider.concurrency,
        "max_attempts": provider.max_attempts,
        "model_aliases": "{}",
        "cooldown_until_0": "",
        "cooldown_until_1": "",
        **changes,
    }
    return client.post(f"/admin/queue_app/provider/{provider.id}/change/", data)


def concurrency_of(provider) -> int:
    return Provider.objects.get(id=provider.id).concurrency


def test_every_door_refuses_a_concurrency_above_the_declared_limit_and_takes_the_limit(
    owner, staff, provider, token_client, client
):
    client.force_login(owner)
    assert provider_page_post(client, provider, concurrency=TOO_MANY).status_code == 200  # the form again, with the error
    client.post(f"/queue/providers/{provider.id}/concurrency", {"concurrency": TOO_MANY})
    api = token_client.post(f"/api/providers/{provider.id}", data={"concurrency": TOO_MANY}, content_type="application/json")
    assert api.status_code == 400 and "concurrency" in api.json()["error"]
    refused = mcp_call(token_client, "save_provider", provider_id=provider.id, concurrency=TOO_MANY)
    assert refused["isError"] is True and str(limits.CONCURRENCY.high) in refused["content"][0]["text"]
    staff_client = Client()
    staff_client.force_login(staff)
    assert admin_post(staff_client, provider, concurrency=TOO_MANY).status_code == 200  # the form again
    with pytest.raises(ValidationError):
        Provider(owner=owner, name="x", family="demo", concurrency=TOO_MANY).full_clean()
    assert concurrency_of(provider) == 1

    # …and the limit itself passes every door
    assert provider_page_post(client, provider, concurrency=limits.CONCURRENCY.high).status_code == 302
    assert concurrency_of(provider) == limits.CONCURRENCY.high
    assert (
        mcp_call(token_client, "save_provider", provider_id=provider.id, concurrency=7)["structuredContent"]["concurrency"] == 7
    )
    assert admin_post(staff_client, Provider.objects.get(id=provider.id), concurrency=9).status_code == 302
    assert concurrency_of(provider) == 9


def test_the_database_holds_the_concurrency_and_max_attempts_limits_for_every_other_writer(provider):
    for changes in ({"concurrency": TOO_MANY}, {"max_attempts": limits.MAX_ATTEMPTS.high + 1}, {"max_attempts": 0}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Provider.objects.filter(id=provider.id).update(**changes)
    assert Provider.objects.filter(id=provider.id, concurrency=1).exists()


def test_max_attempts_is_bounded_on_the_provider_page(owner, provider, client):
    client.force_login(owner)
    response = provider_page_post(client, provider, max_attempts=limits.MAX_ATTEMPTS.high + 1)
    assert response.status_code == 200 and "max_attempts must be a whole number" in response.content.decode()
    assert Provider.objects.get(id=provider.id).max_attempts == 4


@pytest.mark.parametrize(
    "options",
    [{"layers": limits.DEMO_LAYERS.high + 1}, {"fail_rate": 1.5}, {"latency_ms": -1}, {"latency_ms": 10**12}, {"layers": "9"}],
)
def test_demo_options_outside_their_limits_are_refused_in_the_admin(staff, owner, options):
    provider = make_provider(owner)
    client = Client()
    client.force_login(staff)
    response = admin_post(client, provider, options=json.dumps(options))
    assert response.status_code == 200 and "errornote" in response.content.decode()
    assert Provider.objects.get(id=provider.id).options == provider.options


def test_the_demo_provider_never_renders_more_layers_than_the_limit_even_from_an_old_row():
    from queue_app.providers import demo
    from queue_app.providers.base import ResolvedJob

    job = ResolvedJob(
        job_id="j", provider_id=1, family="demo", kind="image", model="demo-layers", prompt="p", params={"layers": 10**6}
    )
    outputs = demo.outputs_for(job)
    assert len(outputs) == 1 + limits.DEMO_LAYERS.high


def nested(depth: int):
    value = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "extra",
    [
        {"params": nested(limits.PARAMS_DEPTH + 1)},
        {"params": {"blob": "x" * (limits.PARAMS_BYTES + 1)}},
        {"params": {"layers": limits.DEMO_LAYERS.high + 1}},
        {"references": ["https://example.com/a.png"] * (limits.REFERENCES + 1)},
        {"references": ["x" * (limits.REFERENCE_CHARS + 1)]},
        {"quantity": limits.QUANTITY.high + 1},
        {"prompt": "x" * (limits.PROMPT_CHARS + 1)},
        {"duration": limits.DURATION.high + 1},
    ],
)
def test_draft_values_past_their_limits_are_refused_by_api_and_mcp_and_create_nothing(project, token_client, extra):
    body = {"prompt": "a fox", **extra}
    api = token_client.post(f"/api/projects/{project.id}/drafts", data=json.dumps(body), content_type="application/json")
    assert api.status_code == 400 and api.json()["error"]
    assert mcp_call(token_client, "create_drafts", project_id=project.id, **body)["isError"] is True
    assert not Job.objects.exists()


def test_the_model_validators_hold_the_same_draft_limits(project, owner):
    job = Job(project=project, owner=owner, prompt="p", params=nested(limits.PARAMS_DEPTH + 1))
    with pytest.raises(ValidationError, match="nested"):
        job.full_clean()
    job = Job(project=project, owner=owner, prompt="p", references=["r"] * (limits.REFERENCES + 1))
    with pytest.raises(ValidationError, match="references"):
        job.full_clean()


def test_the_limit_itself_is_accepted(project, token_client):
    body = {"prompt": "x" * limits.PROMPT_CHARS, "quantity": 2, "params": nested(limits.PARAMS_DEPTH - 1)}
    body["references"] = ["https://example.com/a.png"] * limits.REFERENCES
    response = token_client.post(f"/api/projects/{project.id}/drafts", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    assert Job.objects.count() == 2


def test_a_workflow_past_the_node_or_size_limit_is_refused_and_nothing_is_saved(owner):
    project = Project.objects.create(owner=owner, name="Comfy", kind="comfyui")
    too_many = {str(n): {"class_type": "Note", "inputs": {}} for n in range(limits.WORKFLOW_NODES + 1)}
    too_big = {"1": {"class_type": "Note", "inputs": {"text": "x" * (limits.WORKFLOW_BYTES + 1)}}}
    for workflow, refusal in ((too_many, "nodes"), (too_big, "bytes"), (nested(limits.WORKFLOW_DEPTH + 1), "nested")):
        with pytest.raises(ServiceError, match=refusal):
            comfy_services.comfy_settings_save(user=owner, project=project, base_url="", workflow_json=workflow, bindings=[])
    assert not hasattr(Project.objects.get(id=project.id), "comfy") or not Project.objects.get(id=project.id).comfy.workflow


def test_limits_are_read_from_one_place(monkeypatch, provider, owner, client):
    """Changing the declared number moves the service that every door calls, and the
    monitor's input bounds."""
    monkeypatch.setattr(limits, "CONCURRENCY", limits.Range(1, 5, "concurrency"))
    client.force_login(owner)
    assert 'name="concurrency" min="1" max="5"' in client.get("/queue/").content.decode()
    with pytest.raises(ServiceError, match="from 1 to 5"):
        provider_set_concurrency(user=owner, provider_id=provider.id, concurrency=6)
    assert provider_set_concurrency(user=owner, provider_id=provider.id, concurrency=5).concurrency == 5
    other = make_project(owner, provider)
    assert other.provider_id == provider.id
