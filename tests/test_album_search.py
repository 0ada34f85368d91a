"""The album to find things in (issue 29): filters by project, provider, model, kind, date,
favourites and prompt words, paged by key; favourites set by the item's owner only."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.models import AlbumItem, Status
from queue_app.selectors.album_search import PER_PAGE, AlbumFilter, album_page
from tests.conftest import make_job, make_project, make_provider

pytestmark = pytest.mark.django_db


def made(project, prompt, *, provider=None, model="", kind="text", days_ago=0):
    job = make_job(project, Status.COMPLETED, prompt=prompt, provider=provider, model=model)
    item = AlbumItem.objects.create(project=project, owner=project.owner, job=job, kind=kind, text=prompt, prompt=prompt)
    AlbumItem.objects.filter(id=item.id).update(created_at=timezone.now() - timedelta(days=days_ago))
    return item


def prompts(user, **wanted):
    return [item.prompt for item in album_page(user, AlbumFilter(**wanted))["items"]]


def test_each_filter_narrows_the_album(owner):
    demo, other = make_provider(owner, name="Demo"), make_provider(owner, name="Other")
    project, second = make_project(owner, demo), make_project(owner, name="Second")
    made(project, "a red fox", model="demo-image", kind="image", days_ago=10)
    made(project, "a blue owl", provider=other, model="demo-layers", days_ago=1)
    made(second, "a red owl", provider=other)
    assert prompts(owner) == ["a red owl", "a blue owl", "a red fox"]
    assert prompts(owner, project=project.id) == ["a blue owl", "a red fox"]
    assert prompts(owner, provider=demo.id) == ["a red fox"]  # on the project's provider
    assert prompts(owner, provider=other.id) == ["a red owl", "a blue owl"]
    assert prompts(owner, model="demo-layers") == ["a blue owl"]
    assert prompts(owner, kind="image") == ["a red fox"]
    assert prompts(owner, words=["red", "OWL"]) == ["a red owl"]
    today = timezone.now().date()
    assert prompts(owner, since=today - timedelta(days=2)) == ["a red owl", "a blue owl"]
    assert prompts(owner, until=today - timedelta(days=5)) == ["a red fox"]


def test_favourites_are_starred_by_the_owner_and_filtered(client, owner, outsider):
    project = make_project(owner)
    fox, owl = made(project, "a fox"), made(project, "an owl")
    client.force_login(owner)
    client.post(f"/album/{owl.id}/favourite", {"favourite": "1", "next": "/album/"})
    assert prompts(owner, favourite=True) == ["an owl"]
    page = client.get("/album/?favourite=1").content.decode()
    assert "an owl" in page and "a fox" not in page
    client.force_login(outsider)
    assert client.post(f"/album/{fox.id}/favourite", {"favourite": "1"}).status_code == 404
    assert prompts(owner, favourite=True) == ["an owl"]  # not theirs: nothing changed
    assert "a fox" not in client.get("/album/").content.decode()  # and not shown to them


def test_the_album_pages_by_key(client, owner):
    project = make_project(owner)
    for number in range(PER_PAGE + 2):
        made(project, f"prompt {number}")
    first = album_page(owner, AlbumFilter())
    second = album_page(owner, AlbumFilter(), before=first["next_before"])
    assert len(first["items"]) == PER_PAGE and len(second["items"]) == 2 and second["next_before"] is None
    client.force_login(owner)
    page = client.get("/album/?q=prompt").content.decode()
    assert f"q=prompt&amp;before={first['next_before']}" in page
