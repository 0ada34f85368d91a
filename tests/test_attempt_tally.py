"""Deleted attempts leave their counts in the tallies, once: a clear, a deleted project or
user, the admin's job deletion and the retention pruning (small batches, completed jobs)."""

from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from queue_app.engine import attempt_tally, heartbeats
from queue_app.models import AttemptTally, Job, JobAttempt, Status
from queue_app.selectors import counters
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ran(inline_tasks):
    """Runs n demo jobs of a new provider of `owner` through the inline worker."""
    heartbeats.beat("worker")

    def run(owner, n=3, **provider):
        project = make_project(owner, make_provider(owner, **provider))
        make_drafts(project, n)
        jobs_start(user=owner, project=project, all_drafts=True)
        inline_tasks.run()
        return project

    return run


def ended_total() -> int:
    return sum(counters.ended_attempts().values())


def test_deleting_a_user_folds_each_attempt_once(django_user_model, ran):
    user = make_user(django_user_model, "leaver")
    ran(user, 3)
    before = ended_total()
    assert before == 3
    django_user_model.objects.filter(id=user.id).delete()
    assert not JobAttempt.objects.exists()
    assert AttemptTally.objects.aggregate(n=Sum("ended"))["n"] == 3 and ended_total() == before


def test_the_admin_deletes_jobs_and_attempts_with_their_counts_kept(client, staff, owner, ran):
    project = ran(owner, 2)
    client.force_login(staff)
    job = Job.objects.filter(project=project).first()
    attempt = JobAttempt.objects.filter(job=job).first()
    response = client.post(f"/admin/queue_app/job/{job.id}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Job.objects.filter(id=job.id).exists()
    assert ended_total() == 2 and AttemptTally.objects.aggregate(n=Sum("ended"))["n"] == 1
    other = JobAttempt.objects.exclude(id=attempt.id).get()
    response = client.post(f"/admin/queue_app/jobattempt/{other.id}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not JobAttempt.objects.exists()
    assert ended_total() == 2 and AttemptTally.objects.aggregate(n=Sum("ended"))["n"] == 2


def test_pruning_takes_old_attempts_of_completed_jobs_in_batches(owner, ran):
    ran(owner, 5)
    ran(owner, 2, fail_rate=1, fail_kind="permanent")
    later = timezone.now() + timedelta(days=31)
    assert attempt_tally.prune(older_than=timedelta(days=30), batch=2, now=later) == 2
    assert attempt_tally.prune(older_than=timedelta(days=30), batch=2, now=later) == 2
    assert attempt_tally.prune(older_than=timedelta(days=30), batch=2, now=later) == 1
    assert attempt_tally.prune(older_than=timedelta(days=30), batch=2, now=later) == 0
    # a failed job may be retried and numbers its attempts from the log: its attempts stay
    assert set(JobAttempt.objects.values_list("job__status", flat=True)) == {Status.FAILED}
    # nothing recent is pruned
    assert attempt_tally.prune(older_than=timedelta(days=30), batch=10) == 0
    assert ended_total() == 7


def test_the_roll_up_moves_counts_to_the_totals_and_a_later_delete_counts_nothing_twice(owner, ran, settings):
    from queue_app.models import AttemptTotal, RollupMark
    from queue_app.services.jobs import failed_jobs_clear

    ran(owner, 3)
    ran(owner, 2, fail_rate=1, fail_kind="permanent")
    before, histograms = ended_total(), counters.histograms()
    assert before == 5
    settings.ROLLUP_MARGIN_SECONDS = 600
    assert attempt_tally.roll_up() == 0  # they ended less than the margin ago
    settings.ROLLUP_MARGIN_SECONDS = 0
    assert attempt_tally.roll_up() == 5
    assert attempt_tally.roll_up() == 0  # the mark moved past them
    assert AttemptTotal.objects.aggregate(n=Sum("ended"))["n"] == 5 and JobAttempt.objects.count() == 5
    assert ended_total() == 5 and counters.histograms() == histograms
    failed_jobs_clear(user=owner)  # its attempts were rolled up already: not folded again
    assert ended_total() == 5 and counters.histograms() == histograms
    assert AttemptTotal.objects.aggregate(n=Sum("ended"))["n"] == 5
    ran(owner, 1)  # ends after the mark: counted from the log
    assert ended_total() == 6 and RollupMark.objects.get().upto <= timezone.now()


def test_a_scrape_reads_the_totals_and_the_log_past_the_mark_only(owner, ran, settings):
    from queue_app.selectors.counters import ended_attempts

    ran(owner, 4)
    settings.ROLLUP_MARGIN_SECONDS = 0
    attempt_tally.roll_up()
    # rows before the mark are not read again: changing one does not change the count
    JobAttempt.objects.update(outcome="lost")
    assert {outcome for _, outcome in ended_attempts()} == {"completed"}


def test_old_live_events_are_pruned_in_batches_after_the_retention(owner, settings, monkeypatch):
    from queue_app.models import ProjectEvent
    from queue_app.queue_service import loop

    project = make_project(owner, make_provider(owner))
    old = timezone.now() - timedelta(hours=30)
    ProjectEvent.objects.bulk_create(ProjectEvent(project=project, seq=i, kind="job.updated") for i in range(1, 8))
    ProjectEvent.objects.filter(seq__lte=5).update(created_at=old)
    settings.EVENT_RETENTION_HOURS = 24
    monkeypatch.setattr(loop, "EVENT_BATCH", 2)
    monkeypatch.setattr(loop, "EVENT_PRUNE_BATCHES", 2)
    service = loop.QueueService()
    assert service.step_prune() is True  # two batches of two
    assert ProjectEvent.objects.count() == 3
    assert service.step_prune() is True and service.step_prune() is False
    assert sorted(ProjectEvent.objects.values_list("seq", flat=True)) == [6, 7]
