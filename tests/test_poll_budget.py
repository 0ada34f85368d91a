"""Polling that respects providers: each record's status budget (never exceeded, counted on
a fake clock), Replicate's list endpoint checking a hundred tasks a request, and the
"polling behind" report when a budget cannot cover every task within its cadence."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
import responses
from django.utils import timezone

from queue_app.engine import snapshot
from queue_app.models import Job, Status
from queue_app.providers import budget
from queue_app.providers.base import Running
from queue_app.providers.options import clean_options
from queue_app.queue_service import poll_batch, poll_pool, poller
from queue_app.selectors.queue import queue_status
from queue_app.web.metrics import EVERYONE
from tests.engine_helpers import inflight
from tests.factories import make_drafts, make_project, make_provider
from tests.fakes.dns import use_fake_dns
from tests.fakes.provider_shapes import replicate_prediction

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "https://api.replicate.com/v1/predictions"


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


class FakeClock:
    """Monotonic time that moves only when a check sleeps for its turn or the test says."""

    def __init__(self):
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def step_once(pool, *, timeout: float = 60) -> None:
    """One step of the poller and every check it starts (and those they start), then close it."""
    try:
        pool.step()
        pool.wait(timeout=timeout)
    finally:
        pool.close()


def detached_many(owner, family, n, *, name=None, at=None, **options):
    """`n` detached jobs of one provider record, written in bulk."""
    provider = make_provider(owner, name=name or family, family=family, concurrency=n, **options)
    provider.api_key = f"{family}-key-123456"
    provider.save()
    project = make_project(owner, provider, name=f"{name or family} project", model="m")
    [draft] = make_drafts(project)
    resolved = snapshot.build(draft, project, provider)
    draft.delete()
    at = at or timezone.now()
    Job.objects.bulk_create(
        [
            Job(
                project=project,
                owner=owner,
                prompt="p",
                status=Status.PROCESSING,
                active_provider=provider,
                slot=i,
                lease_token=uuid.uuid4(),
                task_id=f"task{i:04d}",
                task_observed_at=at,
                next_poll_at=at,
                attempts=1,
                resolved=resolved,
            )
            for i in range(n)
        ]
    )
    return provider


# --- the budget -----------------------------------------------------------------------------


def test_the_default_budget_is_the_documented_limit_and_a_record_may_lower_it():
    assert budget.per_minute("replicate") == 3000  # "other endpoints: 3000 requests per minute"
    assert budget.per_minute("civitai") == budget.UNDOCUMENTED_PER_MINUTE  # not published
    assert budget.per_minute("replicate", {"status_per_minute": 6}) == 6
    assert clean_options("replicate", {"status_per_minute": "120"}) == {"status_per_minute": 120}
    for wrong in (0, 60_001, 2.5):
        with pytest.raises(ValueError, match="Status checks per minute"):
            clean_options("runninghub", {"status_per_minute": wrong})


def test_spaced_turns_never_put_more_than_the_budget_in_any_minute():
    clock = FakeClock()
    spacing = budget.Spacing(60, clock=clock.clock, sleep=clock.sleep)
    turns = spacing.reserve(150) + spacing.reserve(50)
    for first in turns:
        assert sum(1 for t in turns if first <= t < first + 60) <= 60
    assert spacing.free(1.0) == 0  # every turn of the next second is taken


def test_the_poller_never_sends_more_status_requests_than_the_budget_allows(owner, monkeypatch):
    detached_many(owner, "runninghub", 12, status_per_minute=6)  # one check every 10 s
    clock = FakeClock()
    sent = []

    class CountingAdapter:
        @staticmethod
        def check(task_id, job):
            sent.append(clock.now)
            return Running()

    monkeypatch.setattr(poller, "adapter_for", lambda family: CountingAdapter)
    pool = poll_pool.Poller(parallelism=1, clock=clock.clock, sleep=clock.sleep)
    try:
        for _ in range(200):  # 200 s of the fake clock, a step a second as the queue service runs
            pool.step()
            pool.wait(timeout=30)
            clock.now += 1
    finally:
        pool.close()
    assert len(sent) >= 12  # the budget allowed 20: every task got its check
    assert all(later - earlier >= 10 - 1e-9 for earlier, later in zip(sent, sent[1:], strict=False))
    assert max(sum(1 for t in sent if start <= t < start + 60) for start in sent) <= 6


# --- batch status ---------------------------------------------------------------------------


@responses.activate
def test_replicate_tasks_are_checked_through_its_list_a_hundred_a_request(owner, inline_tasks):
    provider = detached_many(owner, "replicate", 150)
    running = [replicate_prediction("processing", prediction_id=f"task{i:04d}") for i in range(150)]
    running[7] = replicate_prediction("succeeded", output=["https://replicate.delivery/x.png"], prediction_id="task0007")
    responses.add(responses.GET, LIST, json={"next": f"{LIST}?cursor=p2", "results": running[:100]}, match=[_no_cursor()])
    responses.add(
        responses.GET,
        LIST,
        json={"next": None, "results": running[100:]},
        match=[responses.matchers.query_param_matcher({"cursor": "p2"})],
    )
    single = responses.add(responses.GET, f"{LIST}/task0007", json=running[7])
    pool = poll_pool.Poller(parallelism=4)
    step_once(pool)
    lists = [call for call in responses.calls if call.request.url.split("?")[0] == LIST]
    assert len(lists) == 2  # two requests for 150 tasks, each counted once against the budget
    assert single.call_count == 1  # the finished one is read on its own (outputs, fresh URLs)
    assert len(responses.calls) == 3
    jobs = Job.objects.filter(active_provider=provider).exclude(task_id="task0007")
    assert jobs.count() == 149 and not jobs.filter(poll_claimed_until__isnull=False).exists()
    assert not jobs.filter(next_poll_at__lte=timezone.now()).exists()  # each waits for its next cycle


def _no_cursor():
    return responses.matchers.query_string_matcher("")


def test_what_a_list_leaves_is_checked_singly_within_the_providers_share_of_threads(owner, monkeypatch):
    provider = detached_many(owner, "replicate", 20)
    lock, now_running, peak, checked = threading.Lock(), [0], [0], []

    class ListShowingNoneRunning:
        STATUS_BATCH = 100

        @staticmethod
        def check_page(cursor, job):
            return {}, ""  # every task finished, or not on the list

        @staticmethod
        def check(task_id, job):
            with lock:
                now_running[0] += 1
                peak[0] = max(peak[0], now_running[0])
            time.sleep(0.02)
            with lock:
                now_running[0] -= 1
                checked.append(task_id)
            return Running()

    monkeypatch.setattr(poller, "adapter_for", lambda family: ListShowingNoneRunning)
    pool = poll_pool.Poller(parallelism=4, per_provider=2)
    step_once(pool)
    assert sorted(checked) == [f"task{i:04d}" for i in range(20)]
    assert peak[0] <= 2  # never more than its share: other providers' checks are not queued behind them
    assert not Job.objects.filter(active_provider=provider, poll_claimed_until__isnull=False).exists()


def test_what_a_list_leaves_is_checked_when_the_list_returns_before_its_step_ends(owner, monkeypatch):
    """The batch's thread finishes while the step that started it is still claiming: its
    refill finds the step running and leaves the leftovers to it, so the step must look
    again when it ends (CI saw the leftovers wait for the next step, forever in a test)."""
    detached_many(owner, "replicate", 6)
    checked = []

    class ListShowingNoneRunning:
        STATUS_BATCH = 100

        @staticmethod
        def check_page(cursor, job):
            return {}, ""

        @staticmethod
        def check(task_id, job):
            checked.append(task_id)
            return Running()

    monkeypatch.setattr(poller, "adapter_for", lambda family: ListShowingNoneRunning)
    pool = poll_pool.Poller(parallelism=4, per_provider=2)
    claim_due = poller.claim_due

    waited = []

    def claim_after_the_batch_is_done(**kwargs):
        if not waited:  # the first step's claim; the refills' claims go straight on
            waited.append(True)
            deadline = time.monotonic() + 10
            while (inflight(pool) or not any(pool._leftovers.values())) and time.monotonic() < deadline:
                time.sleep(0.01)
        return claim_due(**kwargs)

    monkeypatch.setattr(poller, "claim_due", claim_after_the_batch_is_done)
    step_once(pool, timeout=10)
    assert sorted(checked) == [f"task{i:04d}" for i in range(6)]


def test_two_batch_claims_never_take_the_same_job(owner):
    provider = detached_many(owner, "replicate", 5)
    now = timezone.now()
    _, first = poll_batch.claim_batch(provider.id, now=now, limit=100, claim_seconds=120)
    _, second = poll_batch.claim_batch(provider.id, now=now, limit=100, claim_seconds=120)
    assert len(first) == 5 and second == []
    # a poller that died: its claim lapses and another batch takes the jobs
    _, later = poll_batch.claim_batch(provider.id, now=now + timedelta(seconds=121), limit=100, claim_seconds=120)
    assert sorted(later) == sorted(first)


@responses.activate
def test_a_failed_list_request_releases_its_tasks_without_a_burst_of_single_checks(owner):
    provider = detached_many(owner, "replicate", 30)
    responses.add(responses.GET, LIST, json={"detail": "down"}, status=503)
    pool = poll_pool.Poller(parallelism=4)
    step_once(pool)
    assert len(responses.calls) == 1
    jobs = Job.objects.filter(active_provider=provider)
    assert not jobs.filter(poll_claimed_until__isnull=False).exists() and not jobs.filter(poll_failures__gt=0).exists()


# --- polling behind -------------------------------------------------------------------------


def provider_row(provider):
    status = queue_status(user=EVERYONE, breakdown="providers")
    return next(row for row in status["providers"] if row["id"] == provider.id), status


def test_the_monitor_says_polling_is_behind_when_the_budget_cannot_cover_every_task(client, owner):
    # 10 tasks every 30 s need 20 checks a minute; the record allows 10: half wait a cycle
    short = detached_many(owner, "runninghub", 10, name="Short", status_per_minute=10)
    enough = detached_many(owner, "runninghub", 10, name="Enough", status_per_minute=20)
    row, status = provider_row(short)
    assert row["polling_behind"] == 5 and row["poll_cycle_seconds"] == 60
    assert row["polling_message"].startswith("polling behind: 5 tasks, cycle ≈ 60 s")
    assert any(warning.startswith("Short: polling behind") for warning in status["warnings"])
    assert status["totals"]["polling_behind"] == 5
    fine, _ = provider_row(enough)
    assert fine["polling_behind"] == 0 and fine["polling_message"] == "" and fine["poll_cycle_seconds"] == 30
    client.force_login(owner)
    page = client.get("/queue/").content.decode()
    assert 'data-alert="polling_behind"' in page and "polling behind: 5 tasks, cycle ≈ 60 s" in page


def test_a_batch_endpoint_covers_what_single_checks_could_not():
    # 5,000 Replicate tasks: 50 list pages a cycle, well inside 3,000 requests a minute
    assert budget.shortfall("replicate", {}, 5000) is None
    short = budget.shortfall("runninghub", {}, 5000)  # one request a task, 600 a minute
    assert short.tasks == 5000 - 300 and short.cycle_seconds == 500


def test_checks_running_late_show_as_behind_whatever_the_budget(owner):
    late = detached_many(owner, "replicate", 4, name="Late", at=timezone.now() - timedelta(minutes=3))
    row, _ = provider_row(late)
    assert row["polling_behind"] == 4 and "checks running late" in row["polling_message"]
    assert row["poll_cycle_seconds"] >= 180


def test_the_metrics_show_the_polling_lag(client, owner, settings):
    settings.METRICS_TOKEN = "scrape-token-123"
    short = detached_many(owner, "runninghub", 10, name="Short", status_per_minute=10)
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-123").content.decode()
    labels = f'family="runninghub",provider="Short",provider_id="{short.id}"'
    assert f"rsq_provider_polling_behind_tasks{{{labels}}} 5.0" in text
    assert f"rsq_provider_poll_cycle_seconds{{{labels}}} 60.0" in text
    assert f"rsq_provider_status_budget_per_minute{{{labels}}} 10.0" in text
