"""Fan-out (issue 29): one prompt to several provider records and models at once through
the workflow's `provider` items, and the album's compare view that shows the results side
by side by provider."""

import pytest

from queue_app.models import AlbumItem, Job
from queue_app.services.combinations import drafts_generate
from queue_app.services.errors import ServiceError
from tests.conftest import make_project, make_provider

pytestmark = pytest.mark.django_db


def item(kind, value, enabled=True):
    return {"type": kind, "value": value, "enabled": enabled}


def test_one_prompt_fans_out_to_two_providers_and_models(owner):
    demo = make_provider(owner, name="Demo A")
    openai = make_provider(owner, name="OpenAI", family="openai")
    project = make_project(owner, demo)
    items = [item("prompt", "a fox"), item("provider", str(demo.id)), item("provider", f"{openai.id}:gpt-image-1")]
    result = drafts_generate(user=owner, project=project, items=items, create=True)
    assert result["combinations"] == 2
    jobs = [Job.objects.get(id=job_id) for job_id in result["job_ids"]]
    assert [(job.provider_id, job.model, job.prompt) for job in jobs] == [
        (demo.id, "", "a fox"),  # the project's own family: the project's model
        (openai.id, "gpt-image-1", "a fox"),
    ]


def test_a_provider_of_another_family_without_a_model_gets_its_default(owner):
    demo = make_provider(owner, name="Demo A")
    openai = make_provider(owner, name="OpenAI", family="openai")
    project = make_project(owner, demo)
    result = drafts_generate(user=owner, project=project, items=[item("prompt", "a"), item("provider", openai.id)], create=True)
    assert Job.objects.get(id=result["job_ids"][0]).model.startswith("gpt-image")


def test_a_provider_that_is_not_yours_or_malformed_refuses_the_batch(owner, outsider):
    theirs = make_provider(outsider, name="Theirs")
    project = make_project(owner)
    with pytest.raises(ServiceError, match="not found"):
        drafts_generate(user=owner, project=project, items=[item("prompt", "a"), item("provider", theirs.id)], create=True)
    with pytest.raises(ServiceError, match="id:model"):
        drafts_generate(user=owner, project=project, items=[item("prompt", "a"), item("provider", "openai")])
    assert Job.objects.count() == 0


def test_the_compare_view_shows_each_prompt_by_provider(client, owner):
    demo = make_provider(owner, name="Demo A")
    other = make_provider(owner, name="Demo B")
    project = make_project(owner, demo)
    items = [item("prompt", "a fox"), item("prompt", "an owl"), item("provider", demo.id), item("provider", other.id)]
    for job_id in drafts_generate(user=owner, project=project, items=items, create=True)["job_ids"]:
        job = Job.objects.get(id=job_id)
        made_by = job.provider.name
        AlbumItem.objects.create(
            project=project, owner=owner, job=job, kind="text", text=f"{made_by}: {job.prompt}", prompt=job.prompt
        )
    client.force_login(owner)
    page = client.get(f"/projects/{project.id}/compare").content.decode()
    header = page[page.index('id="compare"') :]
    assert header.index("Demo A") < header.index("Demo B")
    owl_row = header[header.index("an owl") :]
    assert owl_row.index("Demo A: an owl") < owl_row.index("Demo B: an owl")
    assert "Compare providers" in client.get(f"/projects/{project.id}/").content.decode()
