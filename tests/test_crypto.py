"""Provider keys are encrypted at rest and write-only everywhere."""

import logging

import pytest
import responses
from django.db import connection

from queue_app.models import Job, Provider
from queue_app.services.jobs import jobs_start
from tests.factories import make_provider
from tests.fakes.dns import use_fake_dns
from tests.fakes.provider_shapes import openai_error, openai_images

SENTINEL = "sk-SENTINEL-4f2a9c7e1b3d5f60"
OPENAI_IMAGES = "https://api.openai.com/v1/images/generations"

pytestmark = pytest.mark.django_db


@pytest.fixture
def keyed(owner):
    provider = make_provider(owner, family="openai", name="Keyed")
    provider.api_key = SENTINEL
    provider.api_secret = "secret-SENTINEL-2"
    provider.save()
    return provider


def test_the_key_is_stored_encrypted_and_reads_back(keyed):
    with connection.cursor() as cursor:
        cursor.execute("SELECT api_key_encrypted, api_secret_encrypted FROM queue_app_provider WHERE id = %s", [keyed.id])
        stored_key, stored_secret = cursor.fetchone()
    assert SENTINEL not in stored_key and "SENTINEL" not in stored_secret
    assert Provider.objects.get(id=keyed.id).api_key == SENTINEL


def test_the_key_is_not_in_repr_or_str(keyed):
    assert SENTINEL not in repr(keyed) and SENTINEL not in str(keyed)


def test_admin_pages_show_at_most_the_last_four_characters(client, staff, keyed):
    client.force_login(staff)
    for url in (f"/admin/queue_app/provider/{keyed.id}/change/", "/admin/queue_app/provider/"):
        html = client.get(url).content.decode()
        assert SENTINEL not in html and SENTINEL[:-4] not in html
        assert keyed.api_key_encrypted not in html
    assert SENTINEL[-4:] in client.get(f"/admin/queue_app/provider/{keyed.id}/change/").content.decode()


def test_the_provider_form_is_write_only_and_blank_keeps_the_key(client, owner, keyed):
    client.force_login(owner)
    html = client.get(f"/providers/{keyed.id}/").content.decode()
    assert SENTINEL not in html and keyed.api_key_encrypted not in html
    response = client.post(
        f"/providers/{keyed.id}/",
        {"name": "Renamed", "family": "openai", "base_url": "", "concurrency": 2, "max_attempts": 4, "api_key": ""},
    )
    assert response.status_code == 302
    keyed.refresh_from_db()
    assert keyed.name == "Renamed" and keyed.api_key == SENTINEL


@pytest.mark.django_db(transaction=True)
@responses.activate
def test_the_key_never_reaches_the_logs(owner, keyed, caplog, inline_tasks, monkeypatch):
    """The worker really runs both jobs against a fake OpenAI: one completes, the other is
    refused with an answer that echoes the key (OpenAI's "Incorrect API key provided: …")."""
    from tests.conftest import statuses
    from tests.factories import make_drafts, make_project

    use_fake_dns(monkeypatch)
    responses.add(responses.POST, OPENAI_IMAGES, json=openai_images())
    responses.add(
        responses.POST,
        OPENAI_IMAGES,
        status=401,
        json=openai_error(f"Incorrect API key provided: {SENTINEL}.", code="invalid_api_key"),
    )
    caplog.set_level(logging.DEBUG)
    project = make_project(owner, keyed, model="gpt-image-1")
    jobs = make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()

    # an account problem: the job waits again and the provider is paused until someone looks
    assert sorted(statuses(jobs)) == ["completed", "pending"]
    assert [call.request.headers["Authorization"] for call in responses.calls] == [f"Bearer {SENTINEL}"] * 2
    refused, provider = Job.objects.get(status="pending"), Provider.objects.get(id=keyed.id)
    assert provider.paused and "Incorrect API key" in refused.error
    assert SENTINEL not in refused.error and SENTINEL not in provider.paused_reason
    assert any(r.name.startswith("queue_app") for r in caplog.records), "the task logged nothing: the next line proves nothing"
    assert SENTINEL not in caplog.text


def test_a_rotated_encryption_key_does_not_crash_pages(settings, keyed):
    from queue_app.providers import crypto

    settings.FIELD_ENCRYPTION_KEY = crypto.Fernet.generate_key().decode()
    assert Provider.objects.get(id=keyed.id).api_key == ""
