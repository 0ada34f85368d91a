"""The admin's job list finds jobs as an operator looks for them: by the provider record they
run on (most jobs name none of their own and run on their project's default), and by words
of their prompt."""

import pytest

from queue_app.models import Job, Status
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


def listed(client, query: str) -> set[str]:
    response = client.get(f"/admin/queue_app/job/?{query}")
    assert response.status_code == 200
    return {str(job.id) for job in response.context["cl"].result_list}


def test_the_provider_filter_finds_jobs_on_their_projects_default_their_own_choice_and_the_one_holding_them(client, staff, owner):
    replicate, openai = make_provider(owner, name="Replicate"), make_provider(owner, name="OpenAI")
    project = make_project(owner, replicate, name="Foxes")
    by_default, chosen, held = make_drafts(project, 3)
    Job.objects.filter(id=chosen.id).update(provider=openai)
    Job.objects.filter(id=held.id).update(status=Status.PROCESSING, provider=openai, active_provider=replicate, slot=0)
    client.force_login(staff)
    assert listed(client, f"runs_on={replicate.id}") == {str(by_default.id), str(held.id)}
    assert listed(client, f"runs_on={openai.id}") == {str(chosen.id)}


def test_the_admin_search_finds_prompt_words(client, staff, owner):
    project = make_project(owner, make_provider(owner), name="Foxes")
    fox, owl = make_drafts(project, 2)
    Job.objects.filter(id=fox.id).update(prompt="a red fox in the snow")
    Job.objects.filter(id=owl.id).update(prompt="an owl at dusk")
    client.force_login(staff)
    assert listed(client, "q=fox+snow") == {str(fox.id)}
