"""Agents page every list by key: jobs created or deleted between two pages neither repeat
nor hide another one, and a filter naming something that is not yours is "not found",
never an empty page (issue 32)."""

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from queue_app.models import Job
from queue_app.web import tokens
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def call(owner):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=owner, name='pages')[1]}")

    def tool(name, **arguments):
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        return client.post("/mcp", data=json.dumps(message), content_type="application/json").json()["result"]

    return tool


def list_jobs(call, **arguments) -> dict:
    result = call("list_jobs", status="all", **arguments)
    assert result["isError"] is False, result
    return result["structuredContent"]


def test_jobs_inserted_and_deleted_between_pages_never_repeat_or_hide_another(call, project):
    jobs = make_drafts(project, 9)
    now = timezone.now()
    # three share one instant: the id breaks the tie, so the key is total
    moments = [now - timedelta(minutes=m) for m in (1, 2, 3, 3, 3, 4, 5, 6, 7)]
    for job, moment in zip(jobs, moments, strict=True):
        Job.objects.filter(id=job.id).update(created_at=moment)
    present = {str(job.id) for job in jobs}
    seen: list[str] = []
    page = list_jobs(call, project_id=project.id, limit=2)
    seen += [job["id"] for job in page["jobs"]]
    deleted = set()
    while page.get("nextCursor"):
        # between pages: a newer job arrives, an older one arrives late, one seen and one
        # not yet seen are deleted
        make_drafts(project, 1)
        [late] = make_drafts(project, 1)
        Job.objects.filter(id=late.id).update(created_at=now - timedelta(minutes=10 + len(seen)))  # older than all
        present.add(str(late.id))
        unseen = sorted(present - set(seen) - deleted - {str(late.id)})
        if len(unseen) > 2:
            Job.objects.filter(id=unseen[0]).delete()
            deleted.add(unseen[0])
        Job.objects.filter(id=seen[0]).delete()
        page = list_jobs(call, project_id=project.id, limit=2, cursor=page["nextCursor"])
        seen += [job["id"] for job in page["jobs"]]
    print(f"paged {len(seen)} jobs, {len(deleted)} deleted before they were reached")
    assert len(seen) == len(set(seen)), "a job repeated"
    assert set(seen) == present - deleted, "a job present throughout was skipped"


def test_a_page_of_jobs_is_newest_first_and_says_how_many_match(call, project):
    jobs = make_drafts(project, 3)
    page = list_jobs(call, project_id=project.id, limit=5)
    assert [job["id"] for job in page["jobs"]] == [str(job.id) for job in reversed(jobs)]
    assert page["total"] == 3 and page["nextCursor"] is None


def test_a_foreign_or_unknown_id_in_a_filter_is_not_found(call, project, outsider):
    theirs = make_provider(outsider, name="Theirs")
    their_project = make_project(outsider, theirs)
    make_drafts(their_project, 2)
    for arguments in (
        {"provider_id": theirs.id},
        {"provider_id": 10**9},
        {"project_id": their_project.id},
        {"project_id": 10**9},
    ):
        refused = call("list_jobs", **arguments)
        assert refused["isError"] is True and "not found" in refused["content"][0]["text"], arguments
    for name in ("clear_failed_jobs", "retry_failed_jobs"):
        refused = call(name, provider_id=theirs.id, dry_run=True)
        assert refused["isError"] is True and "not found" in refused["content"][0]["text"], name


@pytest.mark.parametrize("cursor", ["nope", "eyJ0IjogMX0=", "eyJhZnRlciI6IC0xfQ=="])
def test_a_cursor_this_server_did_not_give_is_refused(call, cursor):
    for name in ("list_jobs", "list_projects", "list_providers"):
        refused = call(name, cursor=cursor)
        assert refused["isError"] is True and "cursor" in refused["content"][0]["text"], name


def test_the_api_pages_a_projects_jobs_by_key_too(owner, project):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=owner, name='api')[1]}")
    jobs = make_drafts(project, 3)
    url = f"/api/projects/{project.id}/jobs?status=all&per_page=2&cursor="
    first = client.get(url).json()
    make_drafts(project, 2)  # newer: before the cursor, so nothing shifts
    second = client.get(url + first["next_cursor"]).json()
    ids = [job["id"] for job in first["jobs"] + second["jobs"]]
    assert ids == [str(job.id) for job in reversed(jobs)] and second["next_cursor"] is None


def test_the_api_lists_projects_and_providers_by_key_when_asked(owner, provider):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tokens.token_create(user=owner, name='lists')[1]}")
    projects = [make_project(owner, provider, name=f"P{n}") for n in range(3)]
    first = client.get("/api/projects?limit=2").json()
    projects[0].delete()  # seen already: the next page does not shift back
    make_project(owner, provider, name="late")
    second = client.get(f"/api/projects?limit=2&cursor={first['next_cursor']}").json()
    names = [row["name"] for row in first["projects"] + second["projects"]]
    assert names == ["P0", "P1", "P2", "late"] and second["next_cursor"] is None
    assert "next_cursor" not in client.get("/api/projects").json()  # without asking: the whole list
    page = client.get("/api/providers?cursor=").json()
    assert [row["id"] for row in page["providers"]] == [provider.id] and page["next_cursor"] is None
    assert client.get("/api/providers?cursor=nope").json()["field"] == "cursor"
