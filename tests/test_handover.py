"""Issue 16: one commit per handover. When a worker's job completes, the job leaving its
slot, the claim of the provider's next job into that slot and the opening of that job's
attempt commit together, and the worker goes on with the next job without a trip through
the broker or a second read of it."""

import re
import threading

import pytest
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from queue_app import providers
from queue_app.engine import dispatch, heartbeats
from queue_app.models import Job, JobAttempt, Provider, Status
from queue_app.services.jobs import jobs_start
from queue_app.services.providers import provider_set_paused
from queue_app.worker import execute
from tests.conftest import is_postgres, make_drafts, make_project, make_provider, status_of

pytestmark = pytest.mark.django_db(transaction=True)


def pending(owner, provider, n):
    """n jobs started while the provider was paused: pending, nothing claimed yet."""
    Provider.objects.filter(id=provider.id).update(paused=True)
    project = make_project(owner, provider)
    jobs = make_drafts(project, n)
    jobs_start(user=owner, project=project, all_drafts=True)
    Provider.objects.filter(id=provider.id).update(paused=False)
    return jobs


def started(owner, provider, n):
    """n jobs started on a paused provider, then the first claimed for a worker to run."""
    jobs = pending(owner, provider, n)
    with dispatch.refilled_by_caller(provider.id):
        [first] = dispatch.dispatch(provider.id, hold_one=True)
    return jobs, first


class CallLog:
    """Wraps the provider call: where each call began and ended in the captured queries."""

    def __init__(self, monkeypatch, queries: CaptureQueriesContext, before_call=None):
        self.queries, self.marks, self.before_call = queries, [], before_call
        real = providers.call

        def call(*args, **kwargs):
            if self.before_call is not None:
                self.before_call(len(self.marks) // 2)
            self.marks.append(len(self.queries.captured_queries))
            try:
                return real(*args, **kwargs)
            finally:
                self.marks.append(len(self.queries.captured_queries))

        monkeypatch.setattr(execute.providers, "call", call)

    def between_calls(self, n: int) -> list[str]:
        """The statements from the end of call n to the start of call n + 1."""
        end, start = self.marks[2 * n + 1], self.marks[2 * n + 2]
        return [query["sql"] for query in self.queries.captured_queries[end:start]]


def run_logged(monkeypatch, first, before_call=None) -> CallLog:
    """The worker runs `first` and carries on, every statement captured."""
    with CaptureQueriesContext(connection) as queries:
        log = CallLog(monkeypatch, queries, before_call=before_call)
        execute.run(*first)
    return log


def commits(statements) -> int:
    return sum(1 for sql in statements if sql.strip().upper() == "COMMIT")


def test_a_completion_and_the_next_claim_commit_together(owner, inline_tasks, monkeypatch):
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 3)
    log = run_logged(monkeypatch, first)
    assert [status_of(job) for job in jobs] == [Status.COMPLETED] * 3
    # From one call's end to the next call's start: one commit, which stored the album
    # item, completed the job, claimed the next job and opened its attempt.
    assert [commits(log.between_calls(n)) for n in range(2)] == [1, 1]
    assert inline_tasks.executions() == []  # the worker carried on itself: no broker trip
    for job in jobs:
        [attempt] = JobAttempt.objects.filter(job_id=job.id)
        assert attempt.outcome == JobAttempt.Outcome.COMPLETED
        assert attempt.provider_id == provider.id and attempt.owner_id == owner.id and attempt.queued_at is not None


def test_the_handed_job_runs_under_this_workers_lease_with_its_attempt_open(owner, inline_tasks, monkeypatch):
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 2)
    seen = []

    def before_call(n):
        if n == 1:
            job = Job.objects.get(id=jobs[1].id)
            running = JobAttempt.objects.filter(job_id=job.id, outcome=JobAttempt.Outcome.RUNNING).count()
            seen.append((status_of(jobs[0]), job.status, job.lease_owner == heartbeats.process_name(), running))

    run_logged(monkeypatch, first, before_call=before_call)
    assert seen == [(Status.COMPLETED, Status.PROCESSING, True, 1)]


def test_a_paused_provider_gets_no_handover_and_its_resume_dispatches(owner, inline_tasks, monkeypatch):
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 2)

    def pause_before_first_call(n):
        if n == 0:
            Provider.objects.filter(id=provider.id).update(paused=True)

    run_logged(monkeypatch, first, before_call=pause_before_first_call)
    assert [status_of(job) for job in jobs] == [Status.COMPLETED, Status.PENDING]
    provider_set_paused(user=owner, provider_id=provider.id, paused=False)
    assert status_of(jobs[1]) == Status.PROCESSING
    assert len(inline_tasks.executions()) == 1


def test_a_refused_handover_claim_keeps_the_completion_and_refills_through_dispatch(owner, inline_tasks, monkeypatch):
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 2)
    real = dispatch._claim_rows
    refused = []

    def refuse_in_handover(provider_row, **claim):
        if not refused:
            refused.append(provider_row.id)
            raise IntegrityError("slot taken")
        return real(provider_row, **claim)

    monkeypatch.setattr(dispatch, "_claim_rows", refuse_in_handover)
    execute.run(*first)
    assert refused == [provider.id]
    # The completion committed without the claim; the worker then dispatched on its own.
    assert [status_of(job) for job in jobs] == [Status.COMPLETED, Status.COMPLETED]
    assert JobAttempt.objects.filter(job_id=jobs[0].id, outcome=JobAttempt.Outcome.COMPLETED).count() == 1


def test_past_its_budget_a_worker_hands_the_next_job_to_the_broker_in_the_same_commit(owner, inline_tasks, monkeypatch):
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 2)
    monkeypatch.setattr(execute, "CARRY_ON_BUDGET_SECONDS", 0)
    execute.run(*first)
    assert [status_of(job) for job in jobs] == [Status.COMPLETED, Status.PROCESSING]
    assert [args[0] for args in inline_tasks.executions()] == [str(jobs[1].id)]
    assert Job.objects.get(id=jobs[1].id).lease_owner == ""  # nobody took it yet: the broker's


@pytest.mark.skipif(not is_postgres(), reason="row locks need PostgreSQL (SQLite writes one at a time)")
def test_a_handover_passes_over_a_pending_job_another_transaction_holds(owner, inline_tasks):
    # A project delete or a cancel holding a pending row may be waiting for the row of the
    # job this worker completes: waiting for it in return would deadlock.
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 3)
    locked, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold_second_job():
        try:
            with transaction.atomic():
                Job.objects.select_for_update().filter(id=jobs[1].id).first()
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()
            done.set()

    threading.Thread(target=hold_second_job, daemon=True).start()
    assert locked.wait(5)
    try:
        execute.run(*first)
        assert [status_of(job) for job in jobs] == [Status.COMPLETED, Status.PENDING, Status.COMPLETED]
    finally:
        release.set()
        done.wait(5)
    assert [job_id for job_id, _ in dispatch.dispatch(provider.id)] == [jobs[1].id]


def test_between_two_calls_each_thing_is_read_or_written_once(owner, inline_tasks, monkeypatch):
    # The completing job is read once, locked, with its owner's album usage and storage
    # limit and whether it has items (it has none: none are read); the provider lock
    # carries the count of busy slots; the next job is picked, claimed and its attempt
    # opened, numbered in its insert; then the events. PostgreSQL's candidates statement
    # reads the provider's projects (and those whose jobs name it) itself, and its counter
    # and events are one statement. One project alone writes no fair-share turn.
    # The ledger: the completed claim's line settled, the next claim's reserved.
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 3)
    log = run_logged(monkeypatch, first)
    between = log.between_calls(0)
    work = [sql for sql in between if sql.split()[0].upper() not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")]
    assert len(work) == (11 if is_postgres() else 14), work
    assert commits(between) == 1
    assert [sql for sql in work if "MAX(number)" in sql and sql.lstrip().startswith("SELECT")] == []
    assert [sql for sql in work if sql.startswith('SELECT "queue_app_albumitem".')] == []
    [quota] = [sql for sql in between if "storage_limit_bytes" in sql]
    assert "SUM(size)" in quota and quota.startswith('SELECT "queue_app_job".')
    assert len([sql for sql in work if sql.startswith("SELECT id FROM queue_app_project")]) == (0 if is_postgres() else 1)
    assert [status_of(job) for job in jobs] == [Status.COMPLETED] * 3


@pytest.mark.parametrize("vacated_slot", [0, None], ids=["own slot, lease taken by the claim", "any free slot"])
def test_the_claimed_job_in_hand_is_its_row(owner, inline_tasks, vacated_slot):
    provider = make_provider(owner, concurrency=1)
    pending(owner, provider, 2)
    handover = dispatch.Handover(provider.id)
    with transaction.atomic():
        handover.claim(vacated_slot)
    in_hand, token, attempt = handover.held
    row = Job.objects.get(id=in_hand.id)
    # The lease's expiry is the database's clock; without a vacated slot the lease's owner
    # is set by the attempt's opening after the claim.
    unread = ("lease_expires_at",) if vacated_slot is not None else ("lease_owner", "lease_expires_at")
    differing = [
        field.attname
        for field in Job._meta.concrete_fields
        if field.attname not in unread and getattr(in_hand, field.attname) != getattr(row, field.attname)
    ]
    assert differing == []
    assert row.lease_token == token and row.lease_owner == attempt.worker
    assert in_hand.active_provider.id == provider.id


def test_the_handover_takes_the_next_jobs_lease_in_its_claim(owner, inline_tasks, monkeypatch):
    # One UPDATE claims the next job under this worker's lease: no second one to take it.
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 3)
    log = run_logged(monkeypatch, first)
    updates = [sql for sql in log.between_calls(0) if re.match(r'\s*UPDATE "?queue_app_job"?\s', sql)]
    # the completion and the claim
    assert len(updates) == 2, updates
    second = Job.objects.get(id=jobs[1].id)
    assert second.status == Status.COMPLETED
    assert JobAttempt.objects.get(job_id=second.id).worker == heartbeats.process_name()


def test_a_limit_raised_meanwhile_is_filled_after_the_handovers_commit(owner, inline_tasks):
    # The handover refills only the slot its job left; a dispatch fills the slot freed besides.
    provider = make_provider(owner, concurrency=1)
    jobs, first = started(owner, provider, 4)
    Provider.objects.filter(id=provider.id).update(concurrency=2)
    handover = dispatch.Handover(provider.id, carry_on=True)
    with transaction.atomic():
        Job.objects.filter(id=first[0]).update(status=Status.COMPLETED, active_provider=None, slot=None, lease_token=None)
        handover.claim(vacated_slot=0)
    assert handover.more_room and handover.held is not None
    execute_after = dispatch.dispatch(provider.id)
    assert len(execute_after) == 1
    slots = set(Job.objects.filter(status=Status.PROCESSING).values_list("slot", flat=True))
    assert slots == {0, 1}


def test_a_handover_refills_no_slot_above_a_lowered_limit(owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    pending(owner, provider, 3)
    claimed = dispatch.dispatch(provider.id)
    assert len(claimed) == 2
    in_slot_1 = Job.objects.get(status=Status.PROCESSING, slot=1)
    Provider.objects.filter(id=provider.id).update(concurrency=1)
    handover = dispatch.Handover(provider.id)
    with transaction.atomic():
        Job.objects.filter(id=in_slot_1.id).update(status=Status.COMPLETED, active_provider=None, slot=None, lease_token=None)
        handover.claim(vacated_slot=1)
    assert handover.held is None
    # slot 0 is still held: nothing more may run
    assert dispatch.dispatch(provider.id) == []
    assert Job.objects.filter(status=Status.PROCESSING).count() == 1


@pytest.mark.skipif(not is_postgres(), reason="row locks need PostgreSQL (SQLite writes one at a time)")
def test_handovers_of_one_provider_do_not_wait_for_each_other(owner, inline_tasks):
    # Each refills the slot its own job leaves, so they share the provider lock (they meet
    # only on the project's event counter, at their commit's end); a claim of any free
    # slot (dispatch) still takes the lock alone and waits for them.
    provider = make_provider(owner, concurrency=2)
    pending(owner, provider, 4)
    running = {job.slot: job for job in Job.objects.filter(id__in=[j for j, _ in dispatch.dispatch(provider.id)])}
    assert set(running) == {0, 1}
    locked, release, errors = threading.Event(), threading.Event(), []

    def another_handover_holding_the_lock():
        try:
            with transaction.atomic():
                assert dispatch._lock_provider(provider.id, shared=True) is not None
                locked.set()
                release.wait(20)
        except Exception as error:  # reported below
            errors.append(error)
        finally:
            connections["default"].close()

    thread = threading.Thread(target=another_handover_holding_the_lock)
    thread.start()
    try:
        assert locked.wait(20), errors
        handover = dispatch.Handover(provider.id)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            Job.objects.filter(id=running[1].id).update(
                status=Status.COMPLETED, active_provider=None, slot=None, lease_token=None
            )
            handover.claim(vacated_slot=1)  # an exclusive lock here would time out
        assert handover.held is not None and handover.held[0].slot == 1
        with pytest.raises(OperationalError, match="lock timeout"):
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '300ms'")
                dispatch._lock_provider(provider.id)
    finally:
        release.set()
        thread.join(20)
    assert errors == []
    assert set(Job.objects.filter(status=Status.PROCESSING).values_list("slot", flat=True)) == {0, 1}
