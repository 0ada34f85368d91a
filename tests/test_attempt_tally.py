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
