"""History on the monitor: attempts completed / failed per minute and per 15 minutes, per
provider, queue wait and run time percentiles, SVG charts with hover numbers, and alerts —
all from the append-only attempt log."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.models import Job, JobAttempt, Provider, Status
from queue_app.selectors import history as selectors_history
from queue_app.services.jobs import jobs_start
from queue_app.web import charts
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ran(owner, inline_tasks):
    """A real run: Fast completes 5 demo jobs, Broken fails 3 for good."""
    heartbeats.beat("worker")
    heartbeats.beat("queue_service")
    fast = make_provider(owner, name="Fast", concurrency=2)
    broken = make_provider(owner, name="Broken", fail_rate=1, fail_kind="permanent")
    for provider, n in ((fast, 5), (broken, 3)):
        project = make_project(owner, provider, name=f"{provider.name} project")
        make_drafts(project, n)
        jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    return {"fast": fast, "broken": broken}


def history_row(response, provider_id):
    return next(r for r in response.context["history"]["rows"] if r["provider_id"] == provider_id)


def test_after_a_run_the_monitor_charts_the_attempts_per_provider_with_hover_numbers(client, owner, ran):
    client.force_login(owner)
    response = client.get("/queue/")
    everyone = history_row(response, "all")
    fast, broken = history_row(response, ran["fast"].id), history_row(response, ran["broken"].id)
    assert (everyone["completed"], everyone["failed"]) == (5, 3)
    assert (fast["completed"], fast["failed"]) == (5, 0)
    assert (broken["completed"], broken["failed"]) == (0, 3)
    svg = str(fast["chart"])
    assert svg.startswith("<svg") and svg.count("<g data-bin=") == 60
    # each bar carries its numbers in a <title> (the hover); the run's bars add up to it
    # (the run may straddle a minute boundary)
    hovers = re.findall(r"<title>(\d\d:\d\d) UTC, min: (\d+) completed, (\d+) failed</title>", svg)
    assert len(hovers) == 60 and sum(int(c) for _, c, _ in hovers) == 5 and sum(int(f) for _, _, f in hovers) == 0
    assert hovers[-1][0] == f"{timezone.now():%H:%M}" or hovers[-1][0] == f"{timezone.now() - timedelta(minutes=1):%H:%M}"
    html = response.content.decode()
    assert 'id="history"' in html and "completed, 0 failed</title>" in html


def test_the_day_range_has_15_minute_bins_and_keeps_what_the_hour_dropped(client, owner, ran):
    three_hours_ago = timezone.now() - timedelta(hours=3)
    JobAttempt.objects.filter(outcome="permanent").update(
        started_at=three_hours_ago - timedelta(seconds=5), finished_at=three_hours_ago
    )
    client.force_login(owner)
    hour = client.get("/queue/")
    assert history_row(hour, "all")["failed"] == 0
    day = client.get("/queue/?range=day")
    assert day.context["history"]["range"] == "day"
    broken = history_row(day, ran["broken"].id)
    assert broken["failed"] == 3 and str(broken["chart"]).count("<g data-bin=") == 96
    assert "per 15 min" in day.content.decode()
    assert client.get("/queue/?range=week").context["history"]["range"] == "hour"  # unknown: the default


def test_percentiles_come_from_the_attempt_log(owner, ran):
    now = timezone.now()
    fast_attempts = JobAttempt.objects.filter(job__project__provider=ran["fast"]).order_by("id")
    for i, attempt in enumerate(fast_attempts):  # run times 1.5 s ×4, 40 s ×1
        run = 40 if i == 4 else 1.5
        JobAttempt.objects.filter(id=attempt.id).update(
            started_at=now - timedelta(seconds=run + 1), finished_at=now - timedelta(seconds=1)
        )
    runs = selectors_history.duration_histograms("run", user=owner, since=now - timedelta(hours=1))
    fast = selectors_history.percentiles(runs[ran["fast"].id])
    assert runs[ran["fast"].id]["count"] == 5
    assert 1 < fast["p50"] <= 2.5  # in the (1, 2.5] bucket
    assert 30 < fast["p95"] <= 60  # the slow one
    assert runs["all"]["count"] == 8


def test_a_duration_on_a_bucket_bound_counts_in_that_bucket_and_past_the_last_only_in_the_count(owner, ran):
    """Prometheus' `le`: a run of exactly 1 s is in the 1 s bucket, not the next; one
    past the last bound is only in the count (+Inf). The database buckets them (a
    width_bucket on PostgreSQL, a CASE elsewhere): both sides of every bound agree."""
    now = timezone.now().replace(microsecond=0)
    fast_attempts = JobAttempt.objects.filter(job__project__provider=ran["fast"]).order_by("id")
    # SQLite's julianday arithmetic is off by some 20 µs: there, a hair under each bound
    runs = (1, 1, 2.5, 0.1, 5000) if connection.vendor == "postgresql" else (0.999, 0.999, 2.499, 0.099, 5000)
    for attempt, run in zip(fast_attempts, runs, strict=True):
        JobAttempt.objects.filter(id=attempt.id).update(started_at=now - timedelta(seconds=run), finished_at=now)
    runs = selectors_history.duration_histograms("run", user=owner, since=now - timedelta(hours=1))
    cumulative = dict(runs[ran["fast"].id]["buckets"])
    assert (cumulative[0.1], cumulative[0.5], cumulative[1], cumulative[2.5], cumulative[1800]) == (1, 1, 3, 4, 4)
    assert runs[ran["fast"].id]["count"] == 5


def test_percentiles_interpolate_inside_a_bucket_like_histogram_quantile():
    histogram = {"buckets": [(1, 0), (2, 10), (4, 10)], "count": 10, "sum": 15}
    assert selectors_history.percentiles(histogram, qs=(0.5,)) == {"p50": 1.5}
    assert selectors_history.percentiles({"buckets": [(1, 0)], "count": 0, "sum": 0}) == {"p50": None, "p95": None, "p99": None}
    assert charts.seconds(None) == "—" and charts.seconds(1.234) == "1.23s" and charts.seconds(125) == "2m 05s"


def test_a_failing_provider_and_a_long_wait_are_flagged_on_the_monitor(client, owner, ran, settings):
    settings.ALERT_MIN_ATTEMPTS = 3
    settings.ALERT_WAIT_SECONDS = 120
    slow = make_project(owner, ran["fast"], name="Slow")
    waiting = make_drafts(slow, 1)[0]
    Provider.objects.filter(id=ran["fast"].id).update(concurrency=1)
    Job.objects.filter(id=waiting.id).update(status=Status.PENDING, queued_at=timezone.now() - timedelta(minutes=10))
    client.force_login(owner)
    response = client.get("/queue/")
    rows = {p["name"]: p for p in response.context["summary"]["providers"]}
    assert [a["kind"] for a in rows["Broken"]["alerts"]] == ["failure_rate"]
    assert [a["kind"] for a in rows["Fast"]["alerts"]] == ["wait"]
    html = response.content.decode()
    assert "3 of 3 attempts failed in 5 min" in html and 'data-alert="wait"' in html
    assert "2 provider(s) alerting" in html


def test_a_provider_with_work_and_no_live_worker_is_flagged(client, owner, ran):
    from queue_app.models import Heartbeat

    Heartbeat.objects.all().delete()
    project = make_project(owner, ran["fast"], name="Orphan")
    jobs_start(user=owner, project=project, job_ids=[make_drafts(project, 1)[0].id])
    client.force_login(owner)
    rows = {p["name"]: p for p in client.get("/queue/").context["summary"]["providers"]}
    assert "no_worker" in [a["kind"] for a in rows["Fast"]["alerts"]]


def test_an_old_failure_burst_does_not_raise_the_5_minute_alert(owner, ran, settings):
    settings.ALERT_MIN_ATTEMPTS = 1
    JobAttempt.objects.filter(outcome="permanent").update(finished_at=timezone.now() - timedelta(minutes=6))
    assert selectors_history.failure_rates(user=owner).get(ran["broken"].id) is None


def test_users_see_only_the_history_of_their_own_jobs(client, outsider, ran):
    client.force_login(outsider)
    response = client.get("/queue/")
    assert [(r["completed"], r["failed"]) for r in response.context["history"]["rows"]] == [(0, 0)]


def test_history_queries_do_not_grow_with_the_attempt_log(client, owner, ran):
    client.force_login(owner)

    def count():
        with CaptureQueriesContext(connection) as ctx:
            client.get("/queue/?range=day")
        return len(ctx.captured_queries)

    before = count()
    job = Job.objects.filter(status=Status.COMPLETED).first()
    now = timezone.now()
    JobAttempt.objects.bulk_create(
        [
            JobAttempt(job=job, number=i + 2, worker="h:1", outcome="completed", finished_at=now - timedelta(minutes=i))
            for i in range(300)
        ]
    )
    assert count() == before


def test_the_chart_escapes_a_provider_name():
    svg = str(charts.throughput_svg(bins=[], completed=[], failed=[], step_seconds=60, label='<script>"x"</script>'))
    assert "<script>" not in svg and "&lt;script&gt;" in svg


def test_the_history_is_kept_a_few_seconds_while_alerts_stay_live(client, owner, ran, settings):
    from django.core.cache import cache

    cache.clear()
    settings.HISTORY_CACHE_SECONDS = 30
    client.force_login(owner)

    def get():
        with CaptureQueriesContext(connection) as ctx:
            response = client.get("/queue/?fragment=1")
        return response, len(ctx.captured_queries)

    first, _ = get()
    JobAttempt.objects.filter(outcome="completed").delete()  # the log changes; the charts lag by design
    Provider.objects.filter(id=ran["fast"].id).update(concurrency=1)
    Job.objects.filter(project__provider=ran["fast"]).update(status=Status.PENDING, queued_at=timezone.now() - timedelta(hours=1))
    second, reused = get()
    cache.clear()
    _, computed = get()  # the same state with the charts computed again
    cache.clear()
    assert reused == computed - 4  # failure rates, throughput, two histograms
    assert history_row(second, "all")["completed"] == history_row(first, "all")["completed"] == 5
    fast = next(p for p in second.context["summary"]["providers"] if p["name"] == "Fast")
    assert [a["kind"] for a in fast["alerts"]] == ["wait"]  # read from the live summary, not the cache


def test_the_page_says_how_old_kept_charts_may_be(client, owner, ran, settings):
    from django.core.cache import cache

    cache.clear()
    settings.HISTORY_CACHE_SECONDS = 30
    client.force_login(owner)
    first = client.get("/queue/?fragment=1")
    computed = first.context["history"]["computed_at"]
    later = client.get("/queue/?fragment=1").content.decode()
    cache.clear()
    assert f"as of {computed:%H:%M:%S} UTC" in later and "up to 30 s old" in later


def test_a_rate_limited_attempt_counts_as_failed_and_the_hover_says_so(owner, ran):
    attempt = JobAttempt.objects.filter(outcome="permanent").first()
    JobAttempt.objects.filter(id=attempt.id).update(outcome="rate_limited")
    series = selectors_history.throughput(user=owner)["providers"][ran["broken"].id]
    assert sum(series["failed"]) == 3 and sum(series["rate_limited"]) == 1
    svg = str(
        charts.throughput_svg(
            bins=selectors_history.throughput(user=owner)["bins"],
            step_seconds=60,
            label="Broken",
            **series,
        )
    )
    assert "failed (1 rate-limited)</title>" in svg


def test_an_attempt_copies_its_jobs_provider_owner_and_queued_time_when_it_opens(owner, ran):
    """The history reads the attempt log alone (no join to the jobs): every attempt the run
    opened names the provider, owner and queued time its job had then."""
    attempts = list(JobAttempt.objects.select_related("job__project"))
    assert len(attempts) == 8
    for attempt in attempts:
        job = attempt.job
        assert attempt.provider_id == (job.provider_id or job.project.provider_id)
        assert attempt.owner_id == owner.id
        assert attempt.queued_at is not None and attempt.queued_at == job.queued_at


def test_lost_ambiguous_and_interrupted_attempts_are_counted_apart_from_failed(client, owner, ran, settings):
    """A clean restart (a worker or a ComfyUI instance) ends attempts lost, interrupted or
    ambiguous: the history shows them apart, in amber, and no red "failed" for them."""
    settings.ALERT_MIN_ATTEMPTS = 2
    Job.objects.filter(project__provider=ran["fast"]).update(status=Status.PENDING)
    done = list(JobAttempt.objects.filter(job__project__provider=ran["fast"]).order_by("id"))
    for attempt, outcome in zip(done, ("lost", "ambiguous", "interrupted"), strict=False):
        JobAttempt.objects.filter(id=attempt.id).update(outcome=outcome)
    client.force_login(owner)
    response = client.get("/queue/")
    fast = history_row(response, ran["fast"].id)
    assert (fast["completed"], fast["failed"], fast["lost"]) == (2, 0, 3)
    assert history_row(response, "all")["failed"] == 3  # Broken's permanent failures alone
    svg = str(fast["chart"])
    assert 'fill="#dc2626"' not in svg and 'fill="#d97706"' in svg
    assert sum(int(n) for n in re.findall(r'data-lost="(\d+)"', svg)) == 3
    html = response.content.decode()
    row = html.split(f'data-history="{ran["fast"].id}"')[1].split("</tr>")[0]
    assert "<span data-failed>0</span> failed" in row and "3</span> lost or cancelled" in row
    # and the failure rate behind the alert does not count them either
    rates = selectors_history.failure_rates(user=owner)
    assert rates[ran["fast"].id] == (0, 5)
