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
