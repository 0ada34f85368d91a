"""The state machine: every transition is a compare-and-set; the wrong state is a no-op."""

import threading
import uuid

import pytest
from django.db import close_old_connections, connection

from queue_app.engine import transitions
from queue_app.models import Job, ProjectEvent, Status
from tests.conftest import make_drafts

pytestmark = pytest.mark.django_db(transaction=True)


def test_start_moves_only_drafts_and_failed_jobs(owner, project, inline_tasks):
    draft, failed, completed = make_drafts(project, 3)
    Job.objects.filter(id=failed.id).update(status=Status.FAILED, error="boom")
    Job.objects.filter(id=completed.id).update(status=Status.COMPLETED)
    moved = transitions.jobs_to_pending([draft.id, failed.id, completed.id], from_statuses=(Status.DRAFT, Status.FAILED))
    assert set(moved) == {draft.id, failed.id}
    assert Job.objects.get(id=completed.id).status == Status.COMPLETED
    assert Job.objects.get(id=failed.id).error == ""


@pytest.mark.parametrize("status", [Status.DRAFT, Status.PENDING, Status.COMPLETED, Status.FAILED])
def test_transitions_out_of_processing_are_noops_from_any_other_state(owner, project, status):
    [job] = make_drafts(project)
    token = uuid.uuid4()
    Job.objects.filter(id=job.id).update(status=status, lease_token=token)
    events_before = ProjectEvent.objects.count()
    assert transitions.job_complete(job.id, token) is False
    assert transitions.job_fail(job.id, token, reason="x", error_class="local") is False
    assert transitions.job_requeue(job.id, token, reason="x", error_class="transient") is False
    assert transitions.job_detach(job.id, token, task_id="t", poll_seconds=30) is False
    assert transitions.jobs_heal([job.id], reason="x") == []
    job.refresh_from_db()
    assert job.status == status and job.task_id == "" and job.error == ""
    assert ProjectEvent.objects.count() == events_before


def test_a_fenced_transition_with_a_stale_token_changes_nothing(owner, project, inline_tasks):
    [job] = make_drafts(project)
    transitions.jobs_to_pending([job.id], from_statuses=(Status.DRAFT,))
    job.refresh_from_db()
    assert job.status == Status.PROCESSING
    assert transitions.job_complete(job.id, uuid.uuid4()) is False
    job.refresh_from_db()
    assert job.status == Status.PROCESSING and job.slot == 0


def test_every_transition_records_a_sequenced_event(owner, project, inline_tasks):
    [job] = make_drafts(project)
    transitions.jobs_to_pending([job.id], from_statuses=(Status.DRAFT,))
    inline_tasks.run()
    kinds = list(ProjectEvent.objects.filter(job_id=job.id).order_by("seq").values_list("kind", "status"))
    assert kinds == [("job.started", "pending"), ("job.claimed", "processing"), ("job.completed", "completed")]
    seqs = list(ProjectEvent.objects.filter(project=project).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def _race(n_threads, action):
    barrier = threading.Barrier(n_threads)
    results = []

    def run():
        close_old_connections()
        try:
            barrier.wait()
            results.append(action())
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.postgres
def test_two_threads_racing_one_transition_produce_exactly_one_winner(owner, project, inline_tasks):
    [job] = make_drafts(project)
    transitions.jobs_to_pending([job.id], from_statuses=(Status.DRAFT,))
    token = Job.objects.get(id=job.id).lease_token
    results = _race(2, lambda: transitions.job_fail(job.id, token, reason="race", error_class="local"))
    assert sorted(results) == [False, True]
    assert ProjectEvent.objects.filter(job_id=job.id, kind="job.failed").count() == 1


@pytest.mark.postgres
def test_racing_starts_of_the_same_drafts_move_each_job_once(owner, project, provider, inline_tasks):
    provider.paused = True
    provider.save()
    jobs = make_drafts(project, 20)
    ids = [job.id for job in jobs]
    results = _race(4, lambda: transitions.jobs_to_pending(ids, from_statuses=(Status.DRAFT,)))
    moved = [job_id for result in results for job_id in result]
    assert sorted(moved) == sorted(ids)
    assert ProjectEvent.objects.filter(kind="job.started").count() == 20


@pytest.mark.postgres
def test_racing_dispatchers_never_claim_more_than_the_limit(owner, inline_tasks):
    from queue_app.engine import dispatch
    from tests.conftest import make_project, make_provider

    provider = make_provider(owner, concurrency=3)
    provider.paused = True
    provider.save()
    project = make_project(owner, provider)
    make_drafts(project, 30)
    transitions.jobs_to_pending(list(Job.objects.values_list("id", flat=True)), from_statuses=(Status.DRAFT,))
    type(provider).objects.filter(id=provider.id).update(paused=False)
    results = _race(6, lambda: dispatch.dispatch(provider.id))
    assert sum(len(claimed) for claimed in results) == 3
    assert Job.objects.filter(status=Status.PROCESSING).count() == 3
    assert sorted(Job.objects.filter(status=Status.PROCESSING).values_list("slot", flat=True)) == [0, 1, 2]


def test_a_hand_off_delivered_twice_is_taken_by_one_worker_only(owner, project, inline_tasks):
    from queue_app.engine.attempts import attempt_begin

    [job] = make_drafts(project)
    transitions.jobs_to_pending([job.id], from_statuses=(Status.DRAFT,))
    [(job_id, token)] = inline_tasks.executions()
    job.refresh_from_db()
    first = attempt_begin(job, token)
    second = attempt_begin(job, token)
    assert first is not None and second is None
    job.refresh_from_db()
    assert job.lease_owner == first.worker and job.attempt_log.count() == 1
