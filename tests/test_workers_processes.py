"""The workers page against real clusters: a SIGKILLed cluster stays listed among the dead
with when and what it held, and two clusters on one host each show the jobs they run."""

import socket

import pytest
from django.test import Client

from queue_app.models import Heartbeat, Job, JobAttempt, Status
from queue_app.selectors import workers as selectors_workers
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def cluster_row(proc) -> Heartbeat | None:
    return Heartbeat.objects.filter(role="worker", host=socket.gethostname(), pid=proc.pid).first()


def running_attempts() -> list[JobAttempt]:
    return list(JobAttempt.objects.filter(outcome="running", job__status=Status.PROCESSING))


def listed(proc, attempt) -> bool:
    """The cluster's heartbeat names the process that runs `attempt` among its own."""
    row = cluster_row(proc)
    return row is not None and int(attempt.worker.rpartition(":")[2]) in row.children


def test_a_sigkilled_cluster_is_listed_dead_with_when_and_what_it_held(owner, staff, tmp_path):
    provider = make_provider(owner, concurrency=1, latency_ms=8000)
    project = make_project(owner, provider, name="Killed")
    [job] = make_drafts(project, 1, prompt="a heron over the reeds")
    logs = tmp_path / "logs"
    cluster, service = procs.qcluster(logs, workers=2, HEARTBEAT_SECONDS=1), procs.queue_service(logs)
    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        [attempt] = procs.wait_for(running_attempts, timeout=60, message="a worker running the job")
        procs.wait_for(lambda: listed(cluster, attempt), timeout=30, message="the cluster listing its worker")
        name = cluster_row(cluster).name
        cluster.kill()
        healed = JobAttempt.objects.filter(id=attempt.id, outcome="interrupted")
        procs.wait_for(healed.exists, timeout=30, message="heal")
        tombstone = Heartbeat.objects.filter(name=name, released_at__isnull=False)
        procs.wait_for(tombstone.exists, timeout=30, message="tombstone")
    finally:
        cluster.stop()
        service.stop()
    client = Client()
    client.force_login(staff)
    overview = client.get("/queue/workers/").context["overview"]
    assert name not in [p["name"] for p in overview["live"]]
    [dead] = [p for p in overview["dead"] if p["name"] == name]
    assert dead["released_at"] is not None
    [held] = dead["held"]
    assert held["job_id"] == str(job.id) and held["outcome"] == "interrupted" and held["worker"] == attempt.worker
    html = client.get("/queue/workers/").content.decode()
    assert f'<tr data-process="{name}">' in html and "its claims released" in html and "heron" not in html.split(name)[0]
    assert Job.objects.filter(id=job.id).exclude(status=Status.FAILED).exists()


def test_two_clusters_on_one_host_both_show_the_jobs_they_run(owner, staff, tmp_path):
    # Many short jobs: which cluster's broker takes a task is not ours to choose, so both
    # get work over the run and, at some moment, run jobs at once.
    provider = make_provider(owner, concurrency=4, latency_ms=3000)
    project = make_project(owner, provider, name="Shared host")
    make_drafts(project, 30)
    logs = tmp_path / "logs"
    clusters = [procs.qcluster(logs, workers=2, HEARTBEAT_SECONDS=1) for _ in range(2)]
    service = procs.queue_service(logs)

    def both_busy():
        running = running_attempts()
        if not running or not all(any(listed(c, a) for c in clusters) for a in running):
            return None
        overview = selectors_workers.workers_overview(user=staff)
        live = {p["pid"]: p for p in overview["live"] if p["role"] == "worker"}
        if all(live.get(c.pid, {}).get("running") for c in clusters):
            return overview, running
        return None

    try:
        jobs_start(user=owner, project=project, all_drafts=True)
        overview, running = procs.wait_for(both_busy, timeout=120, message="both clusters running jobs, each shown")
    finally:
        for proc in (*clusters, service):
            proc.stop()
    assert overview["unplaced"] == []
    by_cluster = {p["pid"]: {r["worker"] for r in p["running"]} for p in overview["live"] if p["role"] == "worker"}
    for proc in clusters:
        children = set(cluster_row(proc).children)
        assert by_cluster[proc.pid] and all(int(worker.rpartition(":")[2]) in children for worker in by_cluster[proc.pid])
    assert by_cluster[clusters[0].pid].isdisjoint(by_cluster[clusters[1].pid])
