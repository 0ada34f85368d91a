"""Providers as their owner manages them: the page (every option a field, aliases as
rows), the API, delete refused while work is in flight, "Test key" against the recorded
shapes, and who may change what (issue 18 §5)."""

import json
import re

import pytest
import requests
import responses
from django.contrib.auth.models import Permission

from queue_app.models import Job, Provider, Status
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_start
from queue_app.web.admin import ProviderForm as AdminProviderForm
from tests.conftest import make_drafts, make_project, make_provider, make_user
from tests.fakes.dns import use_fake_dns

pytestmark = pytest.mark.django_db(transaction=True)

OPENAI_MODELS = "https://api.openai.com/v1/models"
GEMINI_MODELS = "https://generativelanguage.googleapis.com/v1beta/models?pageSize=1"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def page_form(**overrides):
    form = {"name": "Demo", "family": "demo", "base_url": "", "concurrency": "2", "max_attempts": "4"}
    form.update(overrides)
    return form


def send(client, method, url, body=None):
    return getattr(client, method)(url, data=json.dumps(body) if body is not None else None, content_type="application/json")


def openai_provider(owner, **fields):
    provider = Provider(owner=owner, name="OpenAI", family="openai", **fields)
    provider.api_key = "sk-test-0123456789abcdef"
    provider.save()
    return provider


# --- The page ---------------------------------------------------------------------------


def test_a_new_provider_takes_options_as_fields_and_aliases_as_rows(signed_in, owner):
    form = page_form(
        opt_demo_mode="async",
        opt_demo_latency_ms="1500",
        opt_demo_fail_rate="0.25",
        opt_demo_layers="",
        alias=["house", ""],
        alias_model=["demo-layers", ""],
    )
    response = signed_in.post("/providers/new", form)
    provider = Provider.objects.get(owner=owner)
    assert response.status_code == 302 and response["Location"] == f"/providers/{provider.id}/"
    assert provider.options == {"mode": "async", "latency_ms": 1500, "fail_rate": 0.25}
    assert provider.model_aliases == {"house": "demo-layers"}
    page = signed_in.get(f"/providers/{provider.id}/").content.decode()
    assert 'name="opt_demo_latency_ms"' in page and 'value="1500"' in page and 'value="house"' in page


@pytest.mark.parametrize(
    "concurrency, message",
    [
        ("0", "concurrency must be at least 1: to stop new work, pause the provider instead"),
        (str(2**63), "concurrency can be at most 1000 jobs at once per provider"),
    ],
)
def test_a_concurrency_out_of_range_gets_a_human_message_and_saves_nothing(signed_in, provider, concurrency, message):
    response = signed_in.post(f"/providers/{provider.id}/", page_form(concurrency=concurrency, name="Changed"))
    assert response.status_code == 200
    assert message in response.content.decode()
    provider.refresh_from_db()
    assert (provider.name, provider.concurrency) == ("Demo", 1)


def test_a_bad_option_is_refused_with_its_label(signed_in, provider):
    response = signed_in.post(f"/providers/{provider.id}/", page_form(opt_demo_fail_rate="2"))
    assert "Failure rate must be a number from 0 to 1" in response.content.decode()
    assert Provider.objects.get(id=provider.id).options == {"latency_ms": 0}


def test_raising_concurrency_on_the_page_dispatches_at_once(signed_in, owner, provider, inline_tasks):
    project = make_project(owner, provider)
    jobs = make_drafts(project, 4)
    jobs_start(user=owner, project=project, all_drafts=True)
    assert Job.objects.filter(status=Status.PROCESSING).count() == 1
    signed_in.post(f"/providers/{provider.id}/", page_form(concurrency="3", opt_demo_latency_ms="0"))
    assert Job.objects.filter(id__in=[j.id for j in jobs], status=Status.PROCESSING).count() == 3


def test_resuming_on_the_page_dispatches_at_once(signed_in, owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    Provider.objects.filter(id=provider.id).update(paused=True)
    project = make_project(owner, provider)
    make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    assert not Job.objects.filter(status=Status.PROCESSING).exists()
    signed_in.post(f"/providers/{provider.id}/", page_form(concurrency="2", opt_demo_latency_ms="0"))
    assert Job.objects.filter(status=Status.PROCESSING).count() == 2


def test_changing_the_base_url_needs_the_key_again(signed_in, owner):
    provider = openai_provider(owner)
    form = page_form(name="OpenAI", family="openai", base_url="https://proxy.example.com/v1")
    refused = signed_in.post(f"/providers/{provider.id}/", form)
    assert "enter the API key again" in refused.content.decode()
    assert Provider.objects.get(id=provider.id).base_url == ""
    signed_in.post(f"/providers/{provider.id}/", {**form, "api_key": "sk-new-key-000000000"})
    provider.refresh_from_db()
    assert (provider.base_url, provider.api_key) == ("https://proxy.example.com/v1", "sk-new-key-000000000")


def test_a_private_base_url_is_refused_without_naming_the_address(signed_in, owner):
    form = page_form(name="Inside", family="openai", base_url="https://internal.example/v1", api_key="sk-0000000000")
    response = signed_in.post("/providers/new", form)
    assert "address not allowed" in response.content.decode() and "10.0.0.7" not in response.content.decode()
    assert not Provider.objects.exists()


def test_delete_is_refused_while_work_is_pending_and_says_how_much(signed_in, owner, provider, project):
    make_drafts(project, 2, status=Status.PENDING)
    page = signed_in.get(f"/providers/{provider.id}/delete").content.decode()
    assert "2 pending and 0 processing" in page
    refused = signed_in.post(f"/providers/{provider.id}/delete")
    assert "Demo still has 2 pending and 0 processing job(s)" in " ".join(str(m) for m in refused.context["messages"])
    assert Provider.objects.filter(id=provider.id).exists()
    Job.objects.update(status=Status.FAILED)
    assert signed_in.post(f"/providers/{provider.id}/delete").status_code == 302
    assert not Provider.objects.exists()
    project.refresh_from_db()
    assert project.provider is None and Job.objects.count() == 2


# --- Test key -----------------------------------------------------------------------------


@responses.activate
def test_test_key_says_ok_for_a_key_the_provider_accepts(signed_in, owner):
    provider = openai_provider(owner)
    responses.add(responses.GET, OPENAI_MODELS, json={"object": "list", "data": []})
    response = signed_in.post(f"/providers/{provider.id}/test", follow=True)
    assert "Test key: ok: the key works (HTTP 200)" in [str(m) for m in response.context["messages"]]
    assert responses.calls[0].request.headers["Authorization"] == "Bearer sk-test-0123456789abcdef"


@responses.activate
def test_test_key_says_bad_key_when_the_provider_refuses_it(signed_in, owner):
    provider = openai_provider(owner)
    body = {"error": {"message": "Incorrect API key provided: sk-test-0123456789abcdef", "code": "invalid_api_key"}}
    responses.add(responses.GET, OPENAI_MODELS, json=body, status=401)
    answer = send(signed_in, "post", f"/api/providers/{provider.id}/test").json()
    assert answer["result"] == "bad_key" and "sk-test" not in json.dumps(answer)


@responses.activate
def test_test_key_says_unreachable_when_nothing_answers(signed_in, owner):
    provider = openai_provider(owner)
    responses.add(responses.GET, OPENAI_MODELS, body=requests.ConnectionError("connection refused"))
    assert send(signed_in, "post", f"/api/providers/{provider.id}/test").json()["result"] == "unreachable"


def test_test_key_never_names_the_address_a_host_resolved_to(signed_in, owner):
    provider = openai_provider(owner, base_url="https://internal.example/v1")  # stored before the guard, say
    answer = send(signed_in, "post", f"/api/providers/{provider.id}/test").json()
    assert answer["result"] == "unreachable" and "address not allowed" in answer["message"]
    assert "10.0.0.7" not in answer["message"]


@pytest.mark.parametrize(
    "family, url, status, body, result",
    [
        (
            "google",
            GEMINI_MODELS,
            400,
            {"error": "API_KEY_INVALID"},
            "bad_key",
        ),
        ("replicate", "https://api.replicate.com/v1/account", 200, {"type": "user", "username": "me"}, "ok"),
        ("runninghub", "https://www.runninghub.ai/openapi/v2/queue/status", 200, {"concurrentLimit": 1}, "ok"),
    ],
)
@responses.activate
def test_test_key_makes_the_cheap_call_of_each_family(owner, family, url, status, body, result):
    from queue_app.providers import keycheck

    provider = Provider(owner=owner, name=family, family=family)
    provider.api_key = "key-0123456789"
    responses.add(responses.GET, url, json=body, status=status)
    assert keycheck.test_key(provider)["result"] == result


@responses.activate
def test_civitai_key_test_counts_a_404_for_an_unknown_workflow_as_accepted(owner):
    from queue_app.providers import keycheck

    provider = Provider(owner=owner, name="c", family="civitai")
    provider.api_key = "key-0123456789"
    responses.add(responses.GET, re.compile(r"https://orchestration\.civitai\.com/v2/consumer/workflows/.+"), status=404)
    assert keycheck.test_key(provider)["result"] == "ok"
    responses.replace(responses.GET, re.compile(r"https://orchestration\.civitai\.com/v2/consumer/workflows/.+"), status=401)
    assert keycheck.test_key(provider)["result"] == "bad_key"


# --- The API ------------------------------------------------------------------------------


def test_api_creates_reads_changes_and_deletes_a_provider(signed_in, owner):
    created = send(
        signed_in, "post", "/api/providers", {"name": "Mine", "family": "demo", "concurrency": 2, "options": {"mode": "async"}}
    )
    assert created.status_code == 201
    provider_id = created.json()["id"]
    assert [p["name"] for p in signed_in.get("/api/providers").json()["providers"]] == ["Mine"]
    changed = send(signed_in, "patch", f"/api/providers/{provider_id}", {"concurrency": 5, "model_aliases": {"x": "demo-image"}})
    assert changed.json()["concurrency"] == 5 and changed.json()["model_aliases"] == {"x": "demo-image"}
    assert signed_in.get(f"/api/providers/{provider_id}").json()["work"] == {"pending": 0, "processing": 0}
    assert send(signed_in, "delete", f"/api/providers/{provider_id}").json()["deleted"] is True
    assert not Provider.objects.exists()


@pytest.mark.parametrize(
    "body, message",
    [
        ({"concurrency": 0}, "at least 1"),
        ({"concurrency": 10**12}, "at most 1000"),
        ({"options": {"fail_rate": 3}}, "Failure rate must be a number from 0 to 1"),
        ({"options": {"colour": "red"}}, "unknown option(s) for demo: colour"),
        ({"model_aliases": {"x": "gpt-image-1"}}, "is not a demo model"),
        ({"name": "Changed", "base_url": "https://proxy.example.com"}, "enter the API key again"),
        ({"family": "cobol"}, "family must be one of"),
    ],
)
def test_a_refused_api_change_says_why_and_changes_nothing(signed_in, provider, body, message):
    response = send(signed_in, "patch", f"/api/providers/{provider.id}", body)
    assert response.status_code == 400 and message in response.json()["error"]
    provider.refresh_from_db()
    assert (provider.name, provider.concurrency, provider.options, provider.base_url) == ("Demo", 1, {"latency_ms": 0}, "")


def test_api_delete_is_refused_while_a_job_holds_a_slot(signed_in, owner, provider, project):
    Job.objects.create(project=project, owner=owner, prompt="p", status=Status.PROCESSING, active_provider=provider, slot=0)
    refused = send(signed_in, "delete", f"/api/providers/{provider.id}")
    assert refused.status_code == 409 and "0 pending and 1 processing" in refused.json()["error"]


def test_an_outsider_sees_no_provider_of_anyone_else(client, outsider, provider):
    client.force_login(outsider)
    assert client.get(f"/api/providers/{provider.id}").status_code == 404
    assert send(client, "patch", f"/api/providers/{provider.id}", {"name": "x"}).status_code == 404
    assert send(client, "post", f"/api/providers/{provider.id}/test").status_code == 404
    assert client.get(f"/providers/{provider.id}/").status_code == 404
    assert client.get("/api/providers").json() == {"providers": []}


# --- Staff is not a master key (issue 18 §5) ---------------------------------------------


@pytest.fixture
def plain_staff(django_user_model):
    return make_user(django_user_model, "plainstaff", is_staff=True)


def test_staff_may_see_but_not_change_another_users_provider(client, plain_staff, provider):
    client.force_login(plain_staff)
    assert client.get(f"/api/providers/{provider.id}").json()["name"] == "Demo"
    refused = send(client, "patch", f"/api/providers/{provider.id}", {"concurrency": 9})
    assert refused.status_code == 403 and "belongs to another user" in refused.json()["error"]
    assert send(client, "post", f"/api/providers/{provider.id}", {"paused": True}).status_code == 403
    page = client.post(f"/providers/{provider.id}/", page_form(concurrency="9"))
    assert "belongs to another user" in page.content.decode()
    provider.refresh_from_db()
    assert (provider.concurrency, provider.paused) == (1, False)


def test_staff_with_the_change_permission_may_change_it(client, plain_staff, provider):
    plain_staff.user_permissions.add(Permission.objects.get(codename="change_provider"))
    client.force_login(plain_staff)
    assert send(client, "patch", f"/api/providers/{provider.id}", {"concurrency": 9}).json()["concurrency"] == 9


def test_the_admin_form_shares_the_url_rule_and_the_concurrency_limit(owner):
    provider = openai_provider(owner)
    data = {
        "owner": owner.id,
        "name": "OpenAI",
        "family": "openai",
        "base_url": "https://proxy.example.com/v1",
        "options": "{}",
        "concurrency": 0,
        "max_attempts": 4,
        "model_aliases": "{}",
    }
    form = AdminProviderForm(data=data, instance=provider)
    assert not form.is_valid()
    assert "enter the API key again" in str(form.errors["api_key"])
    assert "at least 1" in str(form.errors["concurrency"])
    form = AdminProviderForm(data={**data, "concurrency": 2, "api_key": "sk-other-000000000"}, instance=provider)
    assert form.is_valid(), form.errors


def test_a_comfyui_password_never_follows_a_new_address_silently(owner):
    from comfy_app import services as comfy_services
    from comfy_app.models import ComfyInstance

    project = make_project(owner, name="Comfy", kind="comfyui")
    save = dict(user=owner, project=project, workflow_json="", bindings="")
    comfy_services.comfy_settings_save(**save, base_url="https://comfy.example.com", password="s3cret-pass")
    with pytest.raises(ServiceError, match="enter the password again"):
        comfy_services.comfy_settings_save(**save, base_url="https://elsewhere.example.com")
    assert ComfyInstance.objects.get(project=project).base_url == "https://comfy.example.com"
    comfy_services.comfy_settings_save(**save, base_url="https://elsewhere.example.com", password="s3cret-pass")
    assert ComfyInstance.objects.get(project=project).base_url == "https://elsewhere.example.com"


def test_plain_staff_cannot_change_another_users_comfyui_address(owner, plain_staff):
    from comfy_app import services as comfy_services

    project = make_project(owner, name="Comfy", kind="comfyui")
    with pytest.raises(ServiceError, match="belongs to another user"):
        comfy_services.comfy_settings_save(
            user=plain_staff, project=project, workflow_json="", bindings="", base_url="https://x.example.com"
        )


def test_resuming_in_the_admin_dispatches_at_once(client, staff, owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    Provider.objects.filter(id=provider.id).update(paused=True)
    project = make_project(owner, provider)
    make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    client.force_login(staff)
    form = {
        "owner": owner.id,
        "name": "Demo",
        "family": "demo",
        "base_url": "",
        "options": '{"latency_ms": 0}',
        "concurrency": 2,
        "max_attempts": 4,
        "model_aliases": "{}",
        "cooldown_until_0": "",
        "cooldown_until_1": "",
    }
    response = client.post(f"/admin/queue_app/provider/{provider.id}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Job.objects.filter(status=Status.PROCESSING).count() == 2


def test_the_ambiguous_submission_choice_is_a_form_field_of_every_family_and_reaches_the_engine(owner):
    from queue_app.engine import ambiguous
    from queue_app.providers.options import clean_options, declared

    for family in ("demo", "openai", "replicate", "civitai", "runninghub", "google"):
        assert "on_ambiguous" in {option.name for option in declared(family)}
    provider = Provider.objects.create(owner=owner, name="r", family="replicate", options={})
    provider.options = clean_options("replicate", {"on_ambiguous": "hold"}, keep=provider.options)
    provider.save()
    assert provider.options == {"on_ambiguous": "hold"}
    with pytest.raises(ValueError):
        clean_options("replicate", {"on_ambiguous": "sometimes"})
    assert ambiguous.holds(provider.options, "image") and not ambiguous.holds({}, "image")
