"""An unreachable ComfyUI instance is visible where users look: on each affected job and
project (selectors, project page, job page, API) and as a health row on the monitor."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from comfy_app.models import ComfyInstance
from comfy_app.runner import check
from queue_app.models import Status
from queue_app.selectors.job_list import jobs_page
from tests.fakes.comfyui import Script
from tests.test_api import api_client
from tests.test_comfy_runner import comfy_project, job_of, start
from tests.test_comfy_runner import fake as fake  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def hhmm(value) -> str:
    return timezone.localtime(value).strftime("%H:%M")


@pytest.fixture
def outage(owner, fake, inline_tasks):
    """Two prompts at the instance, one job waiting, then the instance stops answering."""
    project, instance = comfy_project(owner, fake)
    fake.default = Script(seconds=60)
    jobs = start(owner, project, 3)
    inline_tasks.run()
    fake.refuse()
    check.check_instance(instance.id)
    since = ComfyInstance.objects.get(id=instance.id).unreachable_since
    expected = f"instance unreachable since {hhmm(since)} — in-flight jobs fail at {hhmm(since + timedelta(minutes=10))}"
    return project, instance, jobs, expected


def test_each_affected_job_names_the_outage_and_when_in_flight_jobs_fail(owner, outage):
    project, _, jobs, expected = outage
    rows = jobs_page(user=owner, project_id=project.id)["jobs"]
    assert sorted(row["status"] for row in rows) == ["pending", "processing", "processing"]
    assert [row["instance_warning"] for row in rows] == [expected] * 3
    assert all(row["waiting_reason"] == expected for row in rows)


def test_the_project_and_job_pages_show_the_outage(owner, outage):
    project, _, jobs, expected = outage
    client = Client()
    client.force_login(owner)
    page = client.get(f"/projects/{project.id}/").content.decode()
    assert 'id="instance-warning"' in page and expected in page
    assert client.get(f"/jobs/{jobs[0].id}/").content.decode().count(expected) == 1


def test_the_api_shows_the_outage_on_jobs_and_projects(owner, outage):
    project, _, _, expected = outage
    api = api_client(owner)
    jobs = api.get(f"/api/projects/{project.id}/jobs").json()["jobs"]
    assert {job["instance_warning"] for job in jobs} == {expected}
    status = api.get("/api/queue/status?breakdown=projects").json()
    [row] = [row for row in status["projects"] if row["id"] == project.id]
    assert row["instance_warning"] == expected
    [health] = status["instances"]
    assert health["reachable"] is False and health["message"] == expected and "connection refused" in health["last_error"]


def test_the_monitor_has_a_health_row_per_instance(owner, outage, fake, inline_tasks):
    project, instance, _, expected = outage
    other, other_instance = comfy_project(owner, fake)
    start(owner, other)
    client = Client()
    client.force_login(owner)
    page = client.get("/queue/").content.decode()
    assert f'data-instance="{project.id}" data-reachable="no"' in page and expected in page
    assert f'data-instance="{other.id}" data-reachable="yes"' in page


def test_after_the_ten_minutes_the_message_says_the_in_flight_jobs_failed_and_the_rest_wait(owner, outage):
    project, instance, jobs, _ = outage
    since = ComfyInstance.objects.get(id=instance.id).unreachable_since
    later = since + timedelta(minutes=10)
    check.check_instance(instance.id, now=later)
    rows = jobs_page(user=owner, project_id=project.id, state="active", now=later)["jobs"]
    waiting = [row for row in rows if row["status"] == "pending"]
    assert len(waiting) == 3 - sum(job_of(job).status == Status.FAILED for job in jobs) == 1
    assert "in-flight jobs failed at" in waiting[0]["instance_warning"]
    assert "waiting jobs start when it answers" in waiting[0]["instance_warning"]


def test_a_healthy_instance_adds_no_warning(owner, fake, inline_tasks):
    project, _ = comfy_project(owner, fake)
    start(owner, project)
    rows = jobs_page(user=owner, project_id=project.id)["jobs"]
    assert rows[0]["instance_warning"] == "" and rows[0]["waiting_reason"] == ""


def test_an_outage_and_its_end_are_each_one_project_event(owner, outage, fake):
    from queue_app.models import ProjectEvent

    project, instance, _, _ = outage
    check.check_instance(instance.id)  # still down: no second event
    kinds = list(ProjectEvent.objects.filter(project=project, kind__startswith="instance.").values_list("kind", flat=True))
    assert kinds == ["instance.unreachable"]
    fake.accept()
    check.check_instance(instance.id)
    check.check_instance(instance.id)
    kinds = list(ProjectEvent.objects.filter(project=project, kind__startswith="instance.").values_list("kind", flat=True))
    assert kinds == ["instance.unreachable", "instance.reachable"]
