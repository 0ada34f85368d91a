"""Issue 16, recovery that scales: healing and the scan's claims move jobs in set-based
batches, and every batch keeps what the per-job path kept — the lease fence, closed
attempts, freed slots, one event per job."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import leases, transitions
from queue_app.models import Job, JobAttempt, ProjectEvent, Provider, Status
from queue_app.queue_service import recovery
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider
from tests.engine_helpers import dispatchable_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def stalled(project, provider, n, *, first_slot=0):
    """n jobs running under `provider` whose worker is gone: lease expired, attempt open."""
    jobs = make_drafts(project, n)
    gone = timezone.now() - timedelta(minutes=5)
    for offset, job in enumerate(jobs):
        Job.objects.filter(id=job.id).update(
            status=Status.PROCESSING,
            active_provider=provider,
            slot=first_slot + offset,
            lease_owner="elsewhere:1",
            lease_token=uuid.uuid4(),
            lease_expires_at=gone,
            attempts=1,
            queued_at=gone,
        )
        JobAttempt.objects.create(job=job, number=1, worker="elsewhere:1")
    return jobs


def paused_provider(owner, concurrency=50):
    provider = make_provider(owner, concurrency=concurrency)
    Provider.objects.filter(id=provider.id).update(paused=True)  # healed jobs stay pending
    return provider, make_project(owner, provider)


def test_more_stalled_jobs_than_one_batch_are_all_healed_with_their_attempts_closed(owner, inline_tasks, monkeypatch):
    monkeypatch.setattr(recovery, "BATCH", 5)
    provider, project = paused_provider(owner)
    jobs = stalled(project, provider, 12)
    assert recovery.heal() == 12
    assert Job.objects.filter(id__in=[j.id for j in jobs], status=Status.PENDING, slot=None, lease_token=None).count() == 12
    assert set(JobAttempt.objects.values_list("outcome", flat=True)) == {"interrupted"}
    assert ProjectEvent.objects.filter(kind="job.healed").count() == 12


def test_a_job_whose_lease_is_renewed_between_the_read_and_the_heal_is_not_healed(owner, inline_tasks, monkeypatch):
    """The batch is read, then its worker renews one lease, then the batch is healed: the
    set-based heal re-checks the lease, so the live worker keeps its job and attempt."""
    provider, project = paused_provider(owner)
    jobs = stalled(project, provider, 3)
    renewed = Job.objects.get(id=jobs[1].id)
    read_batch = recovery.held_for_attention

    def renew_after_the_read(rows):
        assert leases.lease_renew(renewed.id, renewed.lease_token)
        return read_batch(rows)

    monkeypatch.setattr(recovery, "held_for_attention", renew_after_the_read)
    assert recovery.heal() == 2
    kept = Job.objects.get(id=renewed.id)
    assert kept.status == Status.PROCESSING and kept.lease_token == renewed.lease_token and kept.slot == renewed.slot
    assert JobAttempt.objects.get(job_id=renewed.id).outcome == "running"
    assert Job.objects.filter(status=Status.PENDING).count() == 2


def test_after_recovery_every_providers_slots_are_its_processing_jobs(owner, inline_tasks):
    """Stalled jobs of two providers and a backlog: after the scan each provider holds
    exactly its concurrency in distinct slots, and every claim has its own lease token."""
    providers = []
    for concurrency in (3, 4):
        provider = make_provider(owner, concurrency=concurrency)
        project = make_project(owner, provider)
        stalled(project, provider, concurrency)
        backlog = make_drafts(project, 5)
        Job.objects.filter(id__in=[j.id for j in backlog]).update(status=Status.PENDING, queued_at=timezone.now())
        providers.append(provider)
    counts = recovery.recover()
    assert counts["healed"] == 7 and counts["dispatched"] == 7
    for provider in providers:
        held = list(Job.objects.filter(active_provider=provider, status=Status.PROCESSING).values_list("slot", "lease_token"))
        assert sorted(slot for slot, _ in held) == list(range(provider.concurrency))
        assert len({token for _, token in held}) == provider.concurrency
    assert Job.objects.filter(status=Status.PENDING, slot__isnull=False).count() == 0
    assert not JobAttempt.objects.filter(outcome="running").exists()
    assert sorted(token for _, token in inline_tasks.executions()) == sorted(
        str(token) for token in Job.objects.filter(status=Status.PROCESSING).values_list("lease_token", flat=True)
    )


def test_a_claim_batch_gives_each_job_its_slot_snapshot_and_lease(owner, inline_tasks):
    provider = make_provider(owner, concurrency=4)
    project = make_project(owner, provider)
    make_drafts(project, 4)
    jobs_start(user=owner, project=project, all_drafts=True)
    jobs = list(Job.objects.filter(status=Status.PROCESSING).order_by("slot"))
    assert [job.slot for job in jobs] == [0, 1, 2, 3]
    assert all(job.resolved["provider_id"] == provider.id and job.attempts == 1 for job in jobs)
    assert all(job.lease_owner == "" and job.lease_expires_at > timezone.now() for job in jobs)
    assert len({job.lease_token for job in jobs}) == 4
    claimed = ProjectEvent.objects.filter(kind="job.claimed").values_list("job_id", "payload")
    assert {(job_id, payload["slot"]) for job_id, payload in claimed} == {(job.id, job.slot) for job in jobs}


def test_a_claim_batch_passes_over_a_job_that_left_pending_meanwhile(owner, inline_tasks):
    provider = make_provider(owner, concurrency=2)
    project = make_project(owner, provider)
    first, second = make_drafts(project, 2)
    Job.objects.filter(id__in=[first.id, second.id]).update(status=Status.PENDING, queued_at=timezone.now())
    candidates = list(dispatchable_jobs(provider.id).select_related("project"))
    transitions.jobs_cancel([first.id])  # between the candidates' read and the claim
    claimed = transitions.jobs_claim(
        [(job, slot, {"provider_id": provider.id}) for slot, job in enumerate(candidates)], provider_id=provider.id, owner=""
    )
    assert [job_id for job_id, _ in claimed] == [second.id]
    assert Job.objects.get(id=first.id).status == Status.FAILED and Job.objects.get(id=first.id).slot is None


def test_a_heal_batch_over_many_projects_numbers_each_projects_events_without_gaps(owner, inline_tasks):
    provider, first = paused_provider(owner)
    second = make_project(owner, provider)
    transitions.jobs_to_pending([j.id for j in make_drafts(second, 2)], from_statuses=(Status.DRAFT,))  # seq 1, 2
    stalled(first, provider, 3)
    stalled(second, provider, 2, first_slot=3)
    assert recovery.heal() == 5
    for project, expected in ((first, [1, 2, 3]), (second, [1, 2, 3, 4])):
        assert list(ProjectEvent.objects.filter(project=project).order_by("seq").values_list("seq", flat=True)) == expected


def test_a_dead_owners_jobs_leave_in_one_batch_whatever_their_attempts(owner, inline_tasks):
    """Owner known dead, lease not yet expired: jobs with attempts left go back to pending,
    a job at its last attempt fails — at once, not when its lease runs out."""
    import socket

    from tests.test_dead_owners import dead_pid

    provider, project = paused_provider(owner)
    jobs = stalled(project, provider, 3)
    dead = f"{socket.gethostname()}:{dead_pid()}"
    Job.objects.filter(id__in=[j.id for j in jobs]).update(
        lease_owner=dead, lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    Job.objects.filter(id=jobs[0].id).update(attempts=provider.max_attempts)
    assert recovery.heal() == 3
    assert Job.objects.get(id=jobs[0].id).status == Status.FAILED
    assert Job.objects.filter(id__in=[jobs[1].id, jobs[2].id], status=Status.PENDING).count() == 2
    assert set(JobAttempt.objects.values_list("outcome", flat=True)) == {"interrupted"}
