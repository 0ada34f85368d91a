"""Every user sees and changes only their own projects, providers and jobs."""

import pytest

from queue_app.models import AlbumItem, Job, Status
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def theirs(outsider):
    provider = make_provider(outsider, name="Theirs")
    project = make_project(outsider, provider, name="Their project")
    [job] = make_drafts(project)
    item = AlbumItem.objects.create(project=project, owner=outsider, job=job, kind="text", text="private")
    return {"provider": provider, "project": project, "job": job, "item": item}


def test_an_outsider_gets_404_on_every_page_of_anothers_objects(client, owner, theirs):
    client.force_login(owner)
    p, pr, j, item = theirs["project"].id, theirs["provider"].id, theirs["job"].id, theirs["item"].id
    for url in (f"/projects/{p}/", f"/providers/{pr}/", f"/jobs/{j}/", f"/album/{item}/file", f"/album/{item}/poster"):
        assert client.get(url).status_code == 404, url
    for url in (f"/projects/{p}/start", f"/projects/{p}/drafts", f"/providers/{pr}/"):
        assert client.post(url, {"prompt": "x", "quantity": 1, "name": "x", "family": "demo"}).status_code == 404, url
    assert Job.objects.get(id=j).status == Status.DRAFT
    assert Job.objects.filter(project_id=p).count() == 1


def test_lists_show_only_the_users_own_objects(client, owner, theirs):
    make_project(owner, make_provider(owner, name="Mine"), name="My project")
    client.force_login(owner)
    projects = client.get("/projects/").content.decode()
    providers = client.get("/providers/").content.decode()
    assert "My project" in projects and "Their project" not in projects
    assert "Mine" in providers and "Theirs" not in providers


def test_anonymous_visitors_are_sent_to_log_in(client, theirs):
    response = client.get(f"/projects/{theirs['project'].id}/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_owner_sees_their_project_and_its_drafts(client, outsider, theirs):
    client.force_login(outsider)
    html = client.get(f"/projects/{theirs['project'].id}/").content.decode()
    assert "Their project" in html and "a red fox 0" in html
    assert client.get(f"/album/{theirs['item'].id}/file").content == b"private"
