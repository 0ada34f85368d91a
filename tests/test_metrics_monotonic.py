"""Every counter /metrics exports never falls: not when the log is rolled up, failed jobs
are cleared, a project is deleted, old attempts are pruned, nor when the web process
restarts. Scraped from a
real daphne and read with Prometheus' own text parser."""

from datetime import timedelta

import pytest
import requests
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from queue_app.engine import heartbeats
from queue_app.models import AttemptTally, Job, JobAttempt, Status
from queue_app.queue_service.loop import QueueService
from queue_app.services.jobs import failed_jobs_clear, jobs_start
from queue_app.services.projects import project_delete
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

TOKEN = "monotonic-scrape"


def scrape(web) -> dict:
    """{(sample name, labels): value} of every counter and histogram sample."""
    response = requests.get(f"{web.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert response.status_code == 200, response.text
    samples = {}
    for family in text_string_to_metric_families(response.text):
        if family.type in ("counter", "histogram"):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def assert_monotonic(before: dict, after: dict, step: str) -> None:
    fell = {key: (value, after.get(key)) for key, value in before.items() if after.get(key, 0.0) < value}
    assert not fell, f"{step}: counters fell (a reset to Prometheus): {fell}"


def total(samples: dict, name: str) -> float:
    return sum(value for (sample, _), value in samples.items() if sample == name)


def run(owner, provider, n, inline_tasks, *, name):
    project = make_project(owner, provider, name=name)
    make_drafts(project, n)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    return project


def test_every_counter_is_monotonic_across_roll_up_clear_delete_prune_and_restart(owner, inline_tasks, tmp_path, settings):
    heartbeats.beat("worker")
    heartbeats.beat("queue_service")
    fast = make_provider(owner, name="Fast", concurrency=3)
    broken = make_provider(owner, name="Broken", fail_rate=1, fail_kind="permanent")
    run(owner, fast, 4, inline_tasks, name="Kept")
    doomed = run(owner, fast, 3, inline_tasks, name="Doomed")
    run(owner, broken, 2, inline_tasks, name="Failing")
    web = procs.daphne(tmp_path / "logs", METRICS_TOKEN=TOKEN)
    try:
        scrapes = [("a run", scrape(web))]
        ended = JobAttempt.objects.filter(finished_at__isnull=False).count()
        assert total(scrapes[0][1], "rsq_attempts_total") == ended == 9

        # the roll-up moves the log's older part into the totals the scrape reads instead
        settings.ROLLUP_MARGIN_SECONDS = 0
        assert QueueService().step_roll_up() is True
        scrapes.append(("a roll-up", scrape(web)))
        run(owner, broken, 2, inline_tasks, name="Failing later")  # not rolled up when cleared
        assert failed_jobs_clear(user=owner)["cleared"] == 4
        scrapes.append(("clearing failed jobs", scrape(web)))
        project_delete(user=owner, project=doomed)
        scrapes.append(("deleting a project", scrape(web)))
        settings.ATTEMPT_RETENTION_DAYS = 30
        assert QueueService().step_prune_attempts(now=timezone.now() + timedelta(days=31)) is True
        assert not JobAttempt.objects.exists() and Job.objects.filter(status=Status.COMPLETED).count() == 4
        scrapes.append(("pruning old attempts", scrape(web)))
        web.restart()
        procs.wait_for(lambda: procs._accepts(int(web.url.rsplit(":", 1)[1])), timeout=60, message="daphne back")
        scrapes.append(("a restart", scrape(web)))
        run(owner, fast, 2, inline_tasks, name="After")
        scrapes.append(("more work", scrape(web)))
    finally:
        web.stop()
    for (_, before), (step, after) in zip(scrapes, scrapes[1:], strict=False):
        assert_monotonic(before, after, step)
    # nothing was counted twice or lost: every rolled-up or deleted attempt is counted, once
    assert total(scrapes[0][1], "rsq_attempts_total") == total(scrapes[1][1], "rsq_attempts_total") == 9
    assert scrapes[1][1] == scrapes[0][1]  # the roll-up changed no number
    for _, samples in scrapes[2:-1]:
        assert total(samples, "rsq_attempts_total") == 11
        assert samples[("rsq_attempt_run_seconds_count", ())] == 11
        assert samples[("rsq_job_queue_wait_seconds_count", ())] == 11
    assert total(scrapes[-1][1], "rsq_attempts_total") == 13
    assert AttemptTally.objects.exists()
