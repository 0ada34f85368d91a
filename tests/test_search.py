"""Job search on the monitor (prompt text, job id, remote task id) and bulk actions on the
selected jobs or on all N matching, with a confirmation first."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queue_app.models import Job, Status
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


def put(jobs, status_, **fields):
    Job.objects.filter(id__in=[j.id for j in jobs]).update(status=status_, **fields)


@pytest.fixture
def jobs(owner, outsider):
    provider = make_provider(owner, name="Fast")
    alpha = make_project(owner, provider, name="Alpha")
    foxes = make_drafts(alpha, 60, prompt="A Red Fox in snow")  # more than one page (50)
    owls = make_drafts(alpha, 3, prompt="an owl at night")
    put(foxes, Status.FAILED, error="content policy")
    put(owls[:1], Status.FAILED)
    put(owls[1:], Status.PENDING)
    put(owls[2:], Status.PROCESSING, task_id="rh-task-777", active_provider=provider, slot=0)
    theirs = make_project(outsider, make_provider(outsider, name="Theirs"), name="Gamma")
    their_foxes = make_drafts(theirs, 2, prompt="red fox, theirs")
    put(their_foxes, Status.FAILED)
    return {"foxes": foxes, "owls": owls, "alpha": alpha, "their_foxes": their_foxes}


def listed(client, query) -> tuple[int, list[str]]:
    response = client.get("/queue/?" + query)
    assert response.status_code == 200
    return response.context["jobs"]["total"], [row["id"] for row in response.context["jobs"]["jobs"]]


def test_search_finds_jobs_by_a_word_of_their_prompt_case_insensitively(client, owner, jobs):
    client.force_login(owner)
    total, ids = listed(client, "q=OWL&state=all")
    assert total == 3 and set(ids) == {str(j.id) for j in jobs["owls"]}
    assert listed(client, "q=red+fox&state=all")[0] == 60  # not the outsider's two
    assert listed(client, "q=zebra&state=all")[0] == 0


def test_search_finds_a_job_by_its_id_short_id_and_remote_task_id(client, owner, jobs):
    client.force_login(owner)
    owl = jobs["owls"][2]
    assert listed(client, f"q={owl.id}&state=all")[1] == [str(owl.id)]
    assert str(owl.id) in listed(client, f"q={str(owl.id)[:8]}&state=all")[1]
    assert listed(client, "q=rh-task-777&state=all")[1] == [str(owl.id)]
    assert listed(client, "q=rh-task&state=all")[0] == 0  # a task id matches whole


def test_search_never_finds_another_users_job(client, outsider, owner, jobs):
    client.force_login(outsider)
    assert listed(client, f"q={jobs['owls'][0].id}&state=all")[0] == 0
    assert listed(client, "q=fox&state=all")[0] == 2


def test_search_combines_with_the_state_filter(client, owner, jobs):
    client.force_login(owner)
    assert listed(client, "q=owl&state=failed")[0] == 1
    assert listed(client, "q=owl&state=detached")[0] == 1


def test_retry_of_selected_jobs_confirms_first_and_retries_only_failed_ones(client, owner, jobs):
    client.force_login(owner)
    failed_owl, pending_owl = jobs["owls"][0], jobs["owls"][1]
    body = {"op": "retry:selected", "job_ids": [str(failed_owl.id), str(pending_owl.id), "not-a-uuid"], "next": "/queue/"}
    confirm = client.post("/queue/jobs/bulk", body)
    assert confirm.status_code == 200 and confirm.context["count"] == 1 and confirm.context["listed"] == 2
    assert Job.objects.get(id=failed_owl.id).status == Status.FAILED  # nothing happened yet
    done = client.post("/queue/jobs/bulk", {**body, "confirm": "1"}, follow=True)
    assert Job.objects.get(id=failed_owl.id).status == Status.PENDING
    assert Job.objects.get(id=pending_owl.id).status == Status.PENDING
    assert "1 job(s): retry done; 1 skipped" in done.content.decode()


def test_clear_all_matching_acts_on_every_match_beyond_the_first_page(client, owner, jobs):
    client.force_login(owner)
    body = {"op": "clear:matching", "q": "fox", "state": "active", "next": "/queue/?q=fox"}
    confirm = client.post("/queue/jobs/bulk", body)
    assert confirm.context["listed"] == 60 and confirm.context["count"] == 60
    assert "All <b data-listed>60</b> jobs matching the filter" in confirm.content.decode()
    response = client.post("/queue/jobs/bulk", {**body, "confirm": "1"})
    assert response.status_code == 302 and response["Location"] == "/queue/?q=fox"
    assert not Job.objects.filter(id__in=[j.id for j in jobs["foxes"]]).exists()
    assert Job.objects.filter(id__in=[j.id for j in jobs["their_foxes"]]).count() == 2  # the outsider's stay
    assert Job.objects.filter(id__in=[j.id for j in jobs["owls"]]).count() == 3


def test_a_user_cannot_act_on_another_users_jobs_by_id(client, outsider, jobs):
    client.force_login(outsider)
    owl = jobs["owls"][0]
    client.post("/queue/jobs/bulk", {"op": "clear:selected", "job_ids": [str(owl.id)], "confirm": "1"})
    assert Job.objects.filter(id=owl.id, status=Status.FAILED).exists()


def test_staff_retry_all_matching_across_users(client, staff, jobs):
    client.force_login(staff)
    client.post("/queue/jobs/bulk", {"op": "retry:matching", "q": "fox", "state": "failed", "confirm": "1"})
    everyone = [j.id for j in jobs["foxes"] + jobs["their_foxes"]]
    assert Job.objects.filter(id__in=everyone, status=Status.PENDING).count() == 62


def test_bad_bulk_input_answers_a_message_not_an_error(client, owner, jobs):
    client.force_login(owner)
    for body in (
        {"op": "explode:selected"},
        {"op": "retry:everything"},
        {"op": "retry:selected"},
        {"op": "retry:selected", "job_ids": ["x"]},
    ):
        response = client.post("/queue/jobs/bulk", body)
        assert response.status_code == 302
    assert client.get("/queue/jobs/bulk").status_code == 405


def test_the_jobs_list_offers_selection_and_the_all_matching_actions(client, owner, jobs):
    client.force_login(owner)
    html = client.get("/queue/?q=fox").content.decode()
    assert 'name="job_ids"' in html and 'value="clear:matching"' in html and "All 60 matching" in html
    assert 'id="auto-refresh"' in html  # the pause switch


def test_a_search_costs_the_same_queries_for_few_and_many_jobs(client, owner, jobs):
    client.force_login(owner)

    def count():
        with CaptureQueriesContext(connection) as ctx:
            client.get("/queue/?q=fox&state=all")
        return len(ctx.captured_queries)

    few = count()
    make_drafts(jobs["alpha"], 300, prompt="another fox")
    assert count() == few


def test_cancel_all_matching_with_the_real_cancel_service(client, owner, jobs):
    client.force_login(owner)
    body = {"op": "cancel:matching", "q": "owl", "state": "all", "confirm": "1", "next": "/queue/?q=owl"}
    response = client.post("/queue/jobs/bulk", body, follow=True)
    assert "2 job(s): cancel done; 1 skipped" in response.content.decode()
    owls = Job.objects.filter(id__in=[j.id for j in jobs["owls"]])
    assert sorted(owls.values_list("status", flat=True)) == [Status.FAILED] * 3
    assert owls.filter(error_class="cancelled").count() == 2  # the failed owl was not touched
