"""The Queue Monitor page: counts, derived states and reasons, visibility, actions with
confirmation, CSRF, pagination and a constant number of queries."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.models import Job, Provider, Status
from queue_app.selectors.job_list import jobs_page
from queue_app.selectors.queue import queue_status
from queue_app.web import monitor
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


def put(jobs, status_, **fields):
    Job.objects.filter(id__in=[j.id for j in jobs]).update(status=status_, **fields)


@pytest.fixture
def live_processes():
    heartbeats.beat("worker")
    heartbeats.beat("queue_service")


@pytest.fixture
def queue(owner, live_processes):
    """Fast (2 queued, 1 running, 1 detached, 1 failed), Paused (2 waiting), Backoff job."""
    now = timezone.now()
    fast = make_provider(owner, name="Fast", concurrency=3)
    paused = make_provider(owner, name="Paused", concurrency=2)
    Provider.objects.filter(id=paused.id).update(paused=True)
    idle = make_provider(owner, name="Idle", concurrency=5)
    a = make_project(owner, fast, name="Alpha")
    b = make_project(owner, paused, name="Beta")
    jobs = make_drafts(a, 7)
    put(jobs[0:2], Status.PENDING, queued_at=now - timedelta(seconds=30))
    put(jobs[2:3], Status.PROCESSING, active_provider=fast, slot=0, lease_expires_at=now + timedelta(seconds=60))
    put(jobs[3:4], Status.PROCESSING, active_provider=fast, slot=1, task_id="remote-task-1")
    put(jobs[4:5], Status.FAILED, error="content policy: refused")
    put(jobs[5:6], Status.PENDING, queued_at=now, not_before=now + timedelta(minutes=5))
    put(jobs[6:7], Status.COMPLETED)
    waiting = make_drafts(b, 2, prompt="paused prompt")
    put(waiting, Status.PENDING, queued_at=now)
    return {"fast": fast, "paused": paused, "idle": idle, "a": a, "b": b, "jobs": jobs, "waiting": waiting}


def test_it_shows_totals_every_provider_and_busy_projects(client, owner, queue):
    client.force_login(owner)
    response = client.get("/queue/")
    assert response.status_code == 200
    totals = response.context["totals"]
    assert (totals["pending"], totals["processing"], totals["failed"]) == (5, 2, 1)
    assert (totals["queued"], totals["waiting"], totals["running"], totals["detached"]) == (2, 3, 1, 1)
    assert (totals["active_slots"], totals["concurrency"]) == (2, 10)
    assert totals["latency"].endswith("s") and totals["oldest_queued_age_seconds"] >= 29
    names = [p["name"] for p in response.context["summary"]["providers"]]
    assert sorted(names) == ["Fast", "Idle", "Paused"]  # idle providers too
    html = response.content.decode()
    assert "paused" in html and "Alpha" in html and "Beta" in html


def test_jobs_show_why_they_wait(client, owner, queue):
    client.force_login(owner)
    rows = {r["id"]: r for r in client.get("/queue/?state=waiting").context["jobs"]["jobs"]}
    assert {rows[str(j.id)]["waiting_reason"] for j in queue["waiting"]} == {"provider paused"}
    backoff = rows[str(queue["jobs"][5].id)]
    assert backoff["state"] == "waiting" and backoff["waiting_reason"].startswith("backoff until ")
    assert len(rows) == 3


def test_without_a_live_worker_pending_work_waits_with_a_warning(client, owner, queue):
    from queue_app.models import Heartbeat

    Heartbeat.objects.filter(role="worker").delete()
    client.force_login(owner)
    response = client.get("/queue/?state=waiting")
    assert response.context["totals"]["waiting"] == 5
    assert any("no worker cluster is alive" in w for w in response.context["summary"]["warnings"])
    fast = next(p for p in response.context["summary"]["providers"] if p["name"] == "Fast")
    assert fast["warning"] == "dispatchable work but no live worker cluster"
    assert "no live worker" in response.content.decode()


@pytest.mark.parametrize("state", ["waiting", "queued", "running", "detached", "stalled", "failed"])
def test_the_job_filter_counts_the_same_states_as_the_totals(owner, queue, state):
    totals = queue_status(user=owner)["totals"]
    assert jobs_page(user=owner, state=state)["total"] == totals[state]


def test_filters_by_provider_project_model_and_error_text(client, owner, queue):
    client.force_login(owner)

    def total(query):
        return client.get("/queue/?" + query).context["jobs"]["total"]

    assert total(f"provider={queue['paused'].id}") == 2
    assert total(f"project={queue['a'].id}&state=all") == 7
    assert total("error=policy") == 1
    assert total("model=demo-image&state=all") == 9
    assert total("model=nope") == 0


def test_a_user_sees_only_their_own_queue_and_staff_see_everything(client, owner, outsider, staff, queue):
    theirs = make_project(outsider, make_provider(outsider, name="Theirs"), name="Gamma")
    put(make_drafts(theirs, 4), Status.FAILED)
    client.force_login(outsider)
    response = client.get("/queue/")
    assert response.context["totals"]["failed"] == 4 and response.context["totals"]["pending"] == 0
    assert [p["name"] for p in response.context["summary"]["providers"]] == ["Theirs"]
    assert "Alpha" not in response.content.decode()
    client.force_login(staff)
    response = client.get("/queue/")
    assert response.context["totals"]["failed"] == 5 and response.context["totals"]["providers"] == 4


def test_the_fragment_renders_only_the_live_part(client, owner, queue):
    client.force_login(owner)
    html = client.get("/queue/?fragment=1").content.decode()
    assert 'id="providers"' in html and "<html" not in html


def test_the_job_list_is_paginated(client, owner, queue):
    put(make_drafts(queue["a"], 120), Status.FAILED)
    client.force_login(owner)
    first = client.get("/queue/?state=failed").context["jobs"]
    assert len(first["jobs"]) == monitor.PER_PAGE and first["total"] == 121 and first["pages"] == 3
    last = client.get("/queue/?state=failed&page=3").context["jobs"]
    assert len(last["jobs"]) == 21
    ids = {j["id"] for j in first["jobs"]} | {j["id"] for j in last["jobs"]}
    assert len(ids) == monitor.PER_PAGE + 21


def test_pause_resume_and_concurrency_take_effect(client, owner, queue, inline_tasks, django_capture_on_commit_callbacks):
    client.force_login(owner)
    fast = queue["fast"]
    client.post(f"/queue/providers/{fast.id}/pause", {"next": "/queue/"})
    assert Provider.objects.get(id=fast.id).paused
    rows = {r["id"]: r for r in client.get(f"/queue/?provider={fast.id}&state=waiting").context["jobs"]["jobs"]}
    assert {r["waiting_reason"] for r in rows.values() if r["waiting_reason"] != ""} >= {"provider paused"}
    client.post(f"/queue/providers/{fast.id}/resume")
    assert not Provider.objects.get(id=fast.id).paused
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/queue/providers/{fast.id}/concurrency", {"concurrency": "4"})
    assert response.status_code == 302
    assert Provider.objects.get(id=fast.id).concurrency == 4
    # raised concurrency dispatches at once: the two queued jobs were claimed into free slots
    assert Job.objects.filter(active_provider=fast, status=Status.PROCESSING).count() == 4
    client.post(f"/queue/providers/{fast.id}/concurrency", {"concurrency": "0"})
    assert Provider.objects.get(id=fast.id).concurrency == 4


def test_actions_need_csrf(owner, queue):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post(f"/queue/providers/{queue['fast'].id}/pause")
    assert response.status_code == 403
    assert not Provider.objects.get(id=queue["fast"].id).paused


def test_clearing_failed_asks_first_and_says_how_many(client, owner, queue):
    put(make_drafts(queue["b"], 2), Status.FAILED)
    client.force_login(owner)
    response = client.post("/queue/failed/clear", {"scope": "project", "project": queue["b"].id})
    assert response.status_code == 200
    assert response.context["count"] == 2 and "Clear 2 jobs" in response.content.decode()
    assert Job.objects.filter(status=Status.FAILED).count() == 3  # nothing happened yet
    client.post("/queue/failed/clear", {"scope": "project", "project": queue["b"].id, "confirm": "1"})
    assert Job.objects.filter(status=Status.FAILED).count() == 1
    assert Job.objects.filter(status=Status.FAILED, project=queue["a"]).count() == 1


def test_retry_failed_in_a_provider_scope(client, owner, queue, inline_tasks):
    client.force_login(owner)
    failed = queue["jobs"][4]
    response = client.post("/queue/failed/retry", {"scope": "provider", "provider": queue["paused"].id, "confirm": "1"})
    assert response.status_code == 302
    assert Job.objects.get(id=failed.id).status == Status.FAILED  # other provider's queue: untouched
    client.post("/queue/failed/retry", {"scope": "provider", "provider": queue["fast"].id, "confirm": "1"})
    retried = Job.objects.get(id=failed.id)
    assert (retried.status, retried.error, retried.attempts) == (Status.PENDING, "", 0)


def test_foreign_scopes_and_providers_answer_404(client, outsider, queue):
    client.force_login(outsider)
    assert client.post("/queue/failed/clear", {"scope": "project", "project": queue["a"].id}).status_code == 404
    assert client.post("/queue/failed/clear", {"scope": "provider", "provider": queue["fast"].id}).status_code == 404
    assert client.post(f"/queue/providers/{queue['fast'].id}/pause").status_code == 404
    assert not Provider.objects.get(id=queue["fast"].id).paused
    assert Job.objects.filter(status=Status.FAILED).count() == 1


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/",  # scheme-relative: starts with "/", goes off-site
        "///evil.example/",
        "/\\evil.example/",  # browsers read a backslash as a slash
        "\\\\evil.example/",
        "/\t/evil.example/",
        "http:evil.example",
    ],
)
def test_a_redirect_never_leaves_the_site(client, owner, queue, target):
    client.force_login(owner)
    response = client.post(f"/queue/providers/{queue['fast'].id}/pause", {"next": target})
    assert response["Location"] == "/queue/"


def test_a_redirect_back_to_a_page_of_the_site_keeps_its_filters(client, owner, queue):
    client.force_login(owner)
    response = client.post(f"/queue/providers/{queue['fast'].id}/pause", {"next": "/queue/?state=failed&page=2"})
    assert response["Location"] == "/queue/?state=failed&page=2"


def bulk_jobs(project, n, now):
    """n jobs in a realistic mix of states, inserted in one statement."""
    rows = []
    for i in range(n):
        kind = i % 10
        fields = {"status": Status.COMPLETED}
        if kind < 3:
            fields = {"status": Status.PENDING, "queued_at": now - timedelta(seconds=i % 500)}
        elif kind == 3:
            fields = {"status": Status.PENDING, "queued_at": now, "not_before": now + timedelta(seconds=60)}
        elif kind == 4:
            fields = {"status": Status.FAILED, "error": f"error {i}"}
        rows.append(Job(project=project, owner=project.owner, prompt=f"p{i}", **fields))
    Job.objects.bulk_create(rows, batch_size=2000)


def count_queries(fn) -> int:
    with CaptureQueriesContext(connection) as ctx:
        fn()
    return len(ctx.captured_queries)


def test_the_monitor_and_the_status_api_run_the_same_number_of_queries_for_10_and_10000_jobs(client, owner, live_processes):
    now = timezone.now()
    small = make_project(owner, make_provider(owner, name="P1", concurrency=2), name="small")
    big = make_project(owner, make_provider(owner, name="P2", concurrency=2), name="big")
    client.force_login(owner)
    bulk_jobs(small, 10, now)
    pages_small = count_queries(lambda: client.get("/queue/?state=all"))
    api_small = count_queries(lambda: client.get("/api/queue/status?breakdown=all"))
    waiting_small = count_queries(lambda: client.get("/queue/?state=waiting&error=e"))
    bulk_jobs(big, 10_000, now)
    response = client.get("/queue/?state=all")
    listed = response.context["jobs"]
    assert listed["total"] == monitor.COUNT_LIMIT and listed["total_capped"] and len(listed["jobs"]) == monitor.PER_PAGE
    assert "10000+ matching" in response.content.decode()
    assert count_queries(lambda: client.get("/queue/?state=all")) == pages_small
    assert count_queries(lambda: client.get("/api/queue/status?breakdown=all")) == api_small
    assert count_queries(lambda: client.get("/queue/?state=waiting&error=e")) == waiting_small


def grow(owner, providers: int, now):
    """`providers` more providers, each with a project, 10 jobs across the queue's states
    (one of them running in a slot) and an attempt per job that ended in the last hour, a
    third of them failed: every chart, percentile and failure rate has rows to read."""
    from queue_app.models import JobAttempt

    for _ in range(providers):
        number = Provider.objects.count()
        provider = make_provider(owner, name=f"grown {number}", concurrency=2)
        project = make_project(owner, provider, name=f"grown project {number}")
        bulk_jobs(project, 10, now)
        running = Job.objects.filter(project=project, status=Status.COMPLETED).first()
        put([running], Status.PROCESSING, active_provider=provider, slot=0, lease_expires_at=now + timedelta(minutes=1))
        for n, job in enumerate(Job.objects.filter(project=project).exclude(status=Status.PENDING, not_before__isnull=True)):
            ended = now - timedelta(minutes=n * 5)
            attempt = JobAttempt.objects.create(
                job=job, number=1, worker="h:1", outcome="permanent" if n % 3 == 0 else "completed", finished_at=ended
            )
            JobAttempt.objects.filter(id=attempt.id).update(
                started_at=ended - timedelta(seconds=3), queued_at=ended - timedelta(seconds=9)
            )


def test_the_monitor_with_its_charts_runs_the_same_queries_at_5_times_the_jobs_providers_and_attempts(
    client, owner, live_processes, settings
):
    from queue_app.models import JobAttempt
    from queue_app.web.history import CHART_ROWS

    settings.HISTORY_CACHE_SECONDS = 0  # the charts are computed on every request here
    now = timezone.now()
    client.force_login(owner)
    urls = ("/queue/", "/queue/?range=day&fragment=1", "/queue/?state=failed&fragment=1", "/api/queue/status?breakdown=all")
    grow(owner, 3, now)
    charts = client.get("/queue/").context["history"]["rows"]
    assert len(charts) == 1 + 3 and all(row["completed"] and row["failed"] and "<svg" in row["chart"] for row in charts)
    before = {url: count_queries(lambda url=url: client.get(url)) for url in urls}
    sizes = (Job.objects.count(), Provider.objects.count(), JobAttempt.objects.count())

    grow(owner, 12, now)
    assert (Job.objects.count(), Provider.objects.count(), JobAttempt.objects.count()) == tuple(5 * n for n in sizes)
    response = client.get("/queue/")
    assert len(response.context["history"]["rows"]) == 1 + CHART_ROWS and response.context["history"]["more"] == 15 - CHART_ROWS
    assert len(response.context["summary"]["providers"]) == 15
    assert {url: count_queries(lambda url=url: client.get(url)) for url in urls} == before
