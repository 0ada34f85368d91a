"""The live client is one static file (queue_app/static/queue_app/live.js) that the
project page and the job page load and configure with data attributes; WhiteNoise serves it
from the application in every mode, DEBUG off included (as the tests run)."""

import re

import pytest
from django.contrib.staticfiles import finders

from tests.conftest import make_drafts

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def test_the_live_client_is_served_by_the_application(client):
    response = client.get("/static/queue_app/live.js")
    assert response.status_code == 200
    assert response["Content-Type"].startswith(("text/javascript", "application/javascript"))
    body = b"".join(response.streaming_content).decode()
    assert "new WebSocket(" in body and "?after=" in body
    assert client.get("/static/queue_app/missing.js").status_code == 404


def test_the_admin_styles_are_served_too(client):
    assert client.get("/static/admin/css/base.css").status_code == 200


def _live_element(html: str) -> dict:
    match = re.search(r"<div ([^>]*data-live-project[^>]*)>", html)
    assert match, "no element carries data-live-project"
    return dict(re.findall(r'data-live-([a-z]+)="([^"]*)"', match.group(1)))


def test_the_project_page_loads_the_client_and_copies_none_of_it(signed_in, project):
    html = signed_in.get(f"/projects/{project.id}/").content.decode()
    assert '<script src="/static/queue_app/live.js" defer></script>' in html
    assert "WebSocket" not in html
    live = _live_element(html)
    assert live["project"] == str(project.id) and live["after"].isdigit() and live["state"] == "live-state"
    assert "job" not in live


def test_the_job_page_loads_the_client_for_its_one_job(signed_in, project):
    [job] = make_drafts(project)
    html = signed_in.get(f"/jobs/{job.id}/").content.decode()
    assert '<script src="/static/queue_app/live.js" defer></script>' in html
    assert "WebSocket" not in html
    live = _live_element(html)
    assert live == {"project": str(project.id), "after": live["after"], "job": str(job.id), "state": "live-state"}


def test_the_static_file_is_found_where_collectstatic_looks():
    assert finders.find("queue_app/live.js")
