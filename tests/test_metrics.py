"""/metrics: Prometheus text computed at scrape time from the queue status selector and the
attempt log, behind a bearer token or a staff session."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from queue_app.engine import heartbeats
from queue_app.models import Job, JobAttempt, Provider, Status
from queue_app.selectors.queue import queue_status
from queue_app.services.jobs import jobs_start
from queue_app.web.metrics import EVERYONE
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "scrape-token-123"


@pytest.fixture
def ran(owner, outsider, inline_tasks, settings):
    """A run of demo jobs: Fast completes 4, Broken fails 2 for good, Paused holds 3 pending."""
    settings.METRICS_TOKEN = TOKEN
    heartbeats.beat("worker")
    heartbeats.beat("queue_service")
    fast = make_provider(owner, name="Fast", concurrency=2)
    broken = make_provider(owner, name="Broken", fail_rate=1, fail_kind="permanent")
    paused = make_provider(outsider, name="Paused", concurrency=3)
    Provider.objects.filter(id=paused.id).update(paused=True)
    for provider, n in ((fast, 4), (broken, 2), (paused, 3)):
        project = make_project(provider.owner, provider, name=f"{provider.name} project")
        make_drafts(project, n)
        jobs_start(user=provider.owner, project=project, all_drafts=True)
    inline_tasks.run()
    return {"fast": fast, "broken": broken, "paused": paused}


def scrape(client, **headers) -> dict:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def provider_sample(samples, name, provider, **extra):
    labels = {"provider_id": str(provider.id), "provider": provider.name, "family": "demo", **extra}
    return samples[(name, tuple(sorted(labels.items())))]


def test_a_scrape_after_a_run_matches_the_queue_status_selector(client, ran):
    samples = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    status = queue_status(user=EVERYONE, breakdown="providers")
    assert {row["name"] for row in status["providers"]} == {"Fast", "Broken", "Paused"}
    for row in status["providers"]:
        provider = ran[row["name"].lower()]
        for metric, key in (
            ("rsq_provider_pending_jobs", "pending"),
            ("rsq_provider_processing_jobs", "processing"),
            ("rsq_provider_failed_jobs", "failed"),
            ("rsq_provider_slots_used", "active_slots"),
            ("rsq_provider_slots_limit", "concurrency"),
        ):
            assert provider_sample(samples, metric, provider) == row[key], (metric, row["name"])
        assert provider_sample(samples, "rsq_provider_paused", provider) == (1 if row["paused"] else 0)
    # the run's own numbers, so a selector that counted nothing would not pass either
    assert provider_sample(samples, "rsq_provider_pending_jobs", ran["paused"]) == 3
    assert provider_sample(samples, "rsq_provider_failed_jobs", ran["broken"]) == 2
    assert provider_sample(samples, "rsq_provider_slots_limit", ran["fast"]) == 2
    assert provider_sample(samples, "rsq_provider_paused", ran["paused"]) == 1
    assert provider_sample(samples, "rsq_provider_cooling_down", ran["fast"]) == 0
    assert provider_sample(samples, "rsq_provider_oldest_queued_age_seconds", ran["fast"]) == 0
    assert samples[("rsq_jobs", (("state", "failed"),))] == status["totals"]["failed"] == 2
    # the states partition the open jobs: no parent (pending, processing) beside its children
    states = {dict(labels)["state"]: value for (name, labels), value in samples.items() if name == "rsq_jobs"}
    assert set(states) == {"queued", "waiting", "running", "stalled", "detached", "failed"}
    assert sum(states.values()) == Job.objects.filter(status__in=(Status.PENDING, Status.PROCESSING, Status.FAILED)).count()
    paused_states = {
        dict(labels)["state"]: value
        for (name, labels), value in samples.items()
        if name == "rsq_provider_jobs" and ("provider_id", str(ran["paused"].id)) in labels
    }
    assert paused_states["waiting"] == 3 and sum(paused_states.values()) == 3
    assert samples[("rsq_live_processes", (("role", "worker"),))] == 1
    assert samples[("rsq_live_processes", (("role", "queue_service"),))] == 1


def test_attempt_counters_and_histograms_come_from_the_attempt_log(client, ran):
    samples = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    fast, broken = str(ran["fast"].id), str(ran["broken"].id)
    assert samples[("rsq_attempts_total", (("outcome", "completed"), ("provider_id", fast)))] == 4
    assert samples[("rsq_attempts_total", (("outcome", "permanent"), ("provider_id", broken)))] == 2
    assert not [key for key in samples if key[0] == "rsq_attempts_total" and ("outcome", "running") in key[1]]
    assert samples[("rsq_open_attempts", (("phase", "submit"),))] == 0
    finished = JobAttempt.objects.exclude(outcome="running").count()
    assert samples[("rsq_attempt_run_seconds_count", ())] == finished == 6
    assert samples[("rsq_attempt_run_seconds_bucket", (("le", "+Inf"),))] == 6
    assert samples[("rsq_attempt_run_seconds_bucket", (("le", "1800.0"),))] == 6  # demo jobs run in well under a second
    assert 0 <= samples[("rsq_attempt_run_seconds_sum", ())] < 6 * 30
    assert samples[("rsq_job_queue_wait_seconds_count", ())] == 6  # every started job's first attempt


def test_queue_wait_histogram_puts_a_slow_pickup_in_its_bucket(client, ran):
    job = Job.objects.filter(status=Status.COMPLETED).first()
    attempt = JobAttempt.objects.get(job=job)
    queued_at = attempt.started_at - timedelta(seconds=45)
    Job.objects.filter(id=job.id).update(queued_at=queued_at)
    JobAttempt.objects.filter(id=attempt.id).update(queued_at=queued_at)  # the attempt copied it when it opened
    samples = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert samples[("rsq_job_queue_wait_seconds_bucket", (("le", "30.0"),))] == 5
    assert samples[("rsq_job_queue_wait_seconds_bucket", (("le", "60.0"),))] == 6
    assert samples[("rsq_job_queue_wait_seconds_sum", ())] >= 45


def test_alerts_flag_a_failing_provider_and_a_long_wait(client, ran, settings):
    settings.ALERT_MIN_ATTEMPTS = 2
    settings.ALERT_WAIT_SECONDS = 60
    Job.objects.filter(project__provider=ran["fast"]).update(
        status=Status.PENDING, queued_at=timezone.now() - timedelta(minutes=5)
    )
    samples = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert provider_sample(samples, "rsq_provider_alert", ran["broken"], alert="failure_rate") == 1
    assert provider_sample(samples, "rsq_provider_alert", ran["fast"], alert="failure_rate") == 0
    assert provider_sample(samples, "rsq_provider_alert", ran["fast"], alert="wait") == 1
    assert provider_sample(samples, "rsq_provider_alert", ran["paused"], alert="wait") == 0  # paused jobs are not queued


def test_the_oldest_pending_age_counts_every_pending_job_and_names_what_blocks_it(client, ran):
    Job.objects.filter(project__provider=ran["paused"]).update(queued_at=timezone.now() - timedelta(minutes=11))
    samples = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    paused = provider_sample(samples, "rsq_provider_oldest_pending_age_seconds", ran["paused"], reason="paused")
    assert 11 * 60 <= paused < 12 * 60
    assert provider_sample(samples, "rsq_provider_oldest_queued_age_seconds", ran["paused"]) == 0  # dispatchable only
    assert provider_sample(samples, "rsq_provider_oldest_pending_age_seconds", ran["fast"], reason="none") == 0


def test_a_full_worker_outage_still_reports_the_oldest_wait(client, ran):
    from queue_app.models import Heartbeat

    Provider.objects.filter(id=ran["paused"].id).update(paused=False)
    Job.objects.filter(project__provider=ran["paused"]).update(queued_at=timezone.now() - timedelta(minutes=3))
    Heartbeat.objects.filter(role="worker").delete()
    samples = scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    age = provider_sample(samples, "rsq_provider_oldest_pending_age_seconds", ran["paused"], reason="no_worker")
    assert age >= 180


def test_metrics_refuse_a_missing_or_wrong_token_and_a_non_staff_session(client, owner, staff, settings):
    settings.METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    client.force_login(owner)
    assert client.get("/metrics").status_code == 401
    client.force_login(staff)
    assert client.get("/metrics").status_code == 200


def test_an_unset_token_lets_no_bearer_in(client, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_a_scrape_costs_a_constant_number_of_queries(client, ran, owner, django_assert_max_num_queries):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    with django_assert_max_num_queries(16):
        scrape(client, **headers)
    more = make_project(owner, make_provider(owner, name="More"), name="More")
    make_drafts(more, 20)
    jobs_start(user=owner, project=more, all_drafts=True)
    with django_assert_max_num_queries(16):
        scrape(client, **headers)


def test_the_grafana_dashboard_uses_only_metrics_we_expose(client, ran):
    import json
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parent.parent / "docs/grafana/queue-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for t in panel["targets"] for name in re.findall(r"rsq_\w+", t["expr"])}
    exposed = {name for name, _ in scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")}
    assert used and used <= exposed, used - exposed
