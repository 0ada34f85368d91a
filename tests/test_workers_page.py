"""The workers page: live processes, the job each worker runs now and for how long, and
recently dead processes with what they held and what became of it."""

import re
import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import attempts, heartbeats
from queue_app.models import Heartbeat, Job, JobAttempt, Status
from queue_app.selectors import workers as selectors_workers
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_job(owner, inline_tasks, django_capture_on_commit_callbacks):
    """A job claimed by dispatch and taken by this process as its worker (attempt open)."""
    heartbeats.beat("worker")
    heartbeats.beat("queue_service")
    project = make_project(owner, make_provider(owner, name="Fast"), name="Alpha")
    job = make_drafts(project, 1, prompt="a lighthouse at dusk")[0]
    with django_capture_on_commit_callbacks(execute=True):  # dispatch runs on commit
        jobs_start(user=owner, project=project, all_drafts=True)
    job.refresh_from_db()
    assert job.status == Status.PROCESSING
    assert attempts.attempt_begin(job, job.lease_token) is not None
    JobAttempt.objects.filter(job=job).update(started_at=timezone.now() - timedelta(seconds=75))
    return job


def dead_process(host="gone-host", pid=4242, minutes_ago=10):
    now = timezone.now()
    return Heartbeat.objects.create(
        name=f"worker:{host}:{pid}",
        role="worker",
        host=host,
        pid=pid,
        started_at=now - timedelta(minutes=minutes_ago + 30),
        seen_at=now - timedelta(minutes=minutes_ago),
    )


def test_the_page_names_the_job_a_live_worker_runs_and_for_how_long(client, owner, running_job):
    client.force_login(owner)
    response = client.get("/queue/workers/")
    assert response.status_code == 200
    live = {p["role"]: p for p in response.context["overview"]["live"]}
    assert set(live) == {"worker", "queue_service"}
    worker = live["worker"]
    assert worker["host"] == socket.gethostname() and worker["pid"] > 0
    [row] = worker["running"]
    assert row["job_id"] == str(running_job.id) and row["attempt"] == 1
    assert row["running"] == "1m 15s" or row["running"].startswith("1m 1")
    html = response.content.decode()
    assert str(running_job.id)[:8] in html and "a lighthouse at dusk" in html and "running 1m 1" in html
    assert live["queue_service"]["running"] == []


def test_a_finished_attempt_is_no_longer_shown_as_running(client, owner, running_job):
    JobAttempt.objects.filter(job=running_job).update(outcome="completed", finished_at=timezone.now())
    client.force_login(owner)
    worker = next(p for p in client.get("/queue/workers/").context["overview"]["live"] if p["role"] == "worker")
    assert worker["running"] == []


def test_a_dead_process_shows_what_it_held_and_what_became_of_it(client, owner, staff):
    dead = dead_process()
    project = make_project(owner, make_provider(owner), name="Beta")
    healed, lost = make_drafts(project, 2)
    for job, outcome in ((healed, "interrupted"), (lost, "lost")):
        JobAttempt.objects.create(
            job=job, number=1, worker="gone-host:5151", outcome=outcome, finished_at=dead.seen_at + timedelta(seconds=20)
        )
        JobAttempt.objects.filter(job=job).update(started_at=dead.seen_at - timedelta(minutes=2))
    Job.objects.filter(id=healed.id).update(status=Status.COMPLETED)
    Job.objects.filter(id=lost.id).update(status=Status.FAILED, error="lost its worker 4 times")
    # an attempt on another host, or before the process started, was not held by it
    other = make_drafts(project, 1)[0]
    JobAttempt.objects.create(job=other, number=1, worker="elsewhere:1", outcome="interrupted", finished_at=timezone.now())
    client.force_login(staff)
    response = client.get("/queue/workers/")
    [row] = response.context["overview"]["dead"]
    assert row["name"] == dead.name and response.context["overview"]["live"] == []
    held = {r["job_id"]: (r["outcome"], r["job_status"]) for r in row["held"]}
    assert held == {str(healed.id): ("interrupted", "completed"), str(lost.id): ("lost", "failed")}
    html = response.content.decode()
    assert "lost its worker 4 times" in html and "gone-host" in html


def test_a_process_dead_for_over_a_day_is_not_listed(owner):
    dead_process(minutes_ago=25 * 60)
    assert selectors_workers.workers_overview(user=owner)["dead"] == []


def test_users_see_processes_but_not_other_users_jobs(client, outsider, running_job):
    client.force_login(outsider)
    response = client.get("/queue/workers/")
    worker = next(p for p in response.context["overview"]["live"] if p["role"] == "worker")
    assert worker["running"] == [] and "lighthouse" not in response.content.decode()


def test_the_fragment_answers_only_the_live_part(client, owner, running_job):
    client.force_login(owner)
    html = client.get("/queue/workers/?fragment=1").content.decode()
    assert 'id="live-processes"' in html and "<html" not in html


def test_the_page_needs_a_login(client):
    response = client.get("/queue/workers/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_page_costs_a_constant_number_of_queries(
    client, owner, staff, running_job, django_assert_max_num_queries, django_capture_on_commit_callbacks
):
    client.force_login(staff)
    dead_process(pid=999)
    with django_assert_max_num_queries(8) as first:
        client.get("/queue/workers/")
    for pid in range(5):
        dead_process(pid=pid)
    project = make_project(owner, make_provider(owner, name="More", concurrency=5), name="More")
    make_drafts(project, 5)
    with django_capture_on_commit_callbacks(execute=True):
        jobs_start(user=owner, project=project, all_drafts=True)
    for job in Job.objects.filter(project=project, status=Status.PROCESSING):
        attempts.attempt_begin(job, job.lease_token)
    with django_assert_max_num_queries(len(first.captured_queries)):
        response = client.get("/queue/workers/")
    worker = next(p for p in response.context["overview"]["live"] if p["role"] == "worker")
    assert len(worker["running"]) == 6


def test_a_web_process_is_listed_with_its_role_beside_workers_and_queue_services(client, owner):
    heartbeats.beat("worker")
    heartbeats.beat("queue_service")
    heartbeats.beat("web", name="web:web-host:777")
    Heartbeat.objects.filter(name="web:web-host:777").update(host="web-host", pid=777)
    client.force_login(owner)
    response = client.get("/queue/workers/?fragment=1")
    overview = response.context["overview"]
    assert {p["role"] for p in overview["live"]} == {"worker", "queue_service", "web"}
    assert overview["counts"]["web"] == 1
    html = response.content.decode()
    assert "1 web process(es) alive" in html
    assert '<tr data-process="web:web-host:777">' in html and "<td>web</td><td>web-host</td><td>777</td>" in html


def test_importing_the_asgi_application_outside_a_server_starts_no_heartbeat(monkeypatch):
    """Tests and management commands import the application; only a serving process beats."""
    import remixstudio.asgi

    assert "web" not in heartbeats._started
    monkeypatch.setattr("sys.argv", ["/venv/lib/python3.11/site-packages/daphne/__main__.py", "-p", "8000"])
    monkeypatch.delenv("WEB_HEARTBEAT", raising=False)
    assert remixstudio.asgi.serving()
    monkeypatch.setenv("WEB_HEARTBEAT", "0")
    assert not remixstudio.asgi.serving()
    monkeypatch.setattr("sys.argv", ["/venv/bin/pytest"])
    monkeypatch.delenv("WEB_HEARTBEAT")
    assert not remixstudio.asgi.serving()


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_serving_daphne_heartbeats_as_web_and_the_workers_page_lists_it(client, owner, tmp_path):
    from tests import procs

    web = procs.daphne(tmp_path / "logs")
    try:
        procs.wait_for(
            lambda: Heartbeat.objects.filter(role="web", pid=web.pid).exists(), timeout=30, message="daphne's web heartbeat"
        )
        client.force_login(owner)
        live = client.get("/queue/workers/").context["overview"]["live"]
        [row] = [p for p in live if p["role"] == "web"]
        assert row["pid"] == web.pid and row["host"] == socket.gethostname()
    finally:
        web.stop()


def test_a_released_cluster_is_dead_at_once_with_when_it_was_found_dead(client, staff):
    gone = dead_process(host="this-host", pid=321, minutes_ago=0)
    Heartbeat.objects.filter(id=gone.id).update(released_at=timezone.now() - timedelta(seconds=90))
    client.force_login(staff)
    response = client.get("/queue/workers/?fragment=1")
    overview = response.context["overview"]
    assert overview["live"] == [] and [p["name"] for p in overview["dead"]] == [gone.name]
    html = response.content.decode()
    assert re.search(r"\(1m 3\ds ago; its claims released\)", html)
    assert not re.search(r"\d\.\d+ ago", html)  # no raw float seconds


def test_attempts_are_placed_under_the_cluster_that_lists_their_process(owner, running_job):
    """Two clusters on one host: each attempt goes to the cluster whose children name it."""
    host = socket.gethostname()
    attempt = JobAttempt.objects.get(job=running_job)
    worker_pid = int(attempt.worker.rpartition(":")[2])
    now = timezone.now()
    for pid, children in ((70001, [70002, worker_pid]), (70010, [70011])):
        Heartbeat.objects.create(
            name=f"worker:{host}:{pid}", role="worker", host=host, pid=pid, children=children, started_at=now, seen_at=now
        )
    overview = selectors_workers.workers_overview(user=owner)
    running = {p["pid"]: [r["job_id"] for r in p["running"]] for p in overview["live"] if p["role"] == "worker"}
    assert running[70001] == [str(running_job.id)] and running[70010] == [] and overview["unplaced"] == []
