"""Which earlier attempts are looked up before paying again, and which tasks found may be
adopted (engine/reconcile.py); the process tests are in test_reconcile_processes.py."""

from types import SimpleNamespace

import pytest

from queue_app.engine import ambiguous, reconcile
from queue_app.models import JobAttempt, Status
from tests.conftest import make_job, make_project, make_provider
from tests.fakes.provider_shapes import resolved

pytestmark = pytest.mark.django_db
Outcome = JobAttempt.Outcome


def _attempt(job, number, outcome, task_id=""):
    return JobAttempt.objects.create(job=job, number=number, outcome=outcome, task_id=task_id)


def test_a_family_with_a_lookup_is_never_held_and_one_without_keeps_its_policy():
    hold = {"on_ambiguous": "hold"}
    assert not ambiguous.holds(hold, "image", "replicate") and not ambiguous.holds(hold, "video", "civitai")
    assert ambiguous.holds(hold, "image", "openai") and ambiguous.holds({}, "video", "runninghub")


def test_only_attempts_that_may_have_reached_the_provider_are_looked_up_by_their_tag(owner):
    project = make_project(owner, make_provider(owner))
    job = make_job(project, Status.PROCESSING)
    _attempt(job, 1, Outcome.INTERRUPTED)
    _attempt(job, 2, Outcome.TRANSIENT)  # refused: nothing was created
    _attempt(job, 3, Outcome.AMBIGUOUS)
    _attempt(job, 4, Outcome.INTERRUPTED, task_id="stored")  # its id was stored: not lost
    _attempt(job, 5, Outcome.LOCAL)  # answered, but its outputs could not be stored here
    asked = []

    def find_submitted(request, tag, since):
        asked.append(tag)
        return {f"rs-{job.id}-5": ["t5"], f"rs-{job.id}-3": ["t3"], f"rs-{job.id}-1": ["t1", "t3"]}.get(tag, [])

    adapter = SimpleNamespace(find_submitted=find_submitted)
    assert reconcile.candidates(adapter, resolved("civitai"), job.id, 6) == ["t5", "t3", "t1"]
    assert asked == [f"rs-{job.id}-5", f"rs-{job.id}-3", f"rs-{job.id}-1"]


def test_a_task_any_job_or_attempt_stored_is_not_adopted_again(owner):
    project = make_project(owner, make_provider(owner))
    mine, other = make_job(project, Status.PROCESSING), make_job(project, Status.PROCESSING, task_id="held")
    _attempt(mine, 1, Outcome.AMBIGUOUS)
    _attempt(mine, 2, Outcome.TRANSIENT, task_id="seen-failing")
    adapter = SimpleNamespace(find_submitted=lambda request, tag, since: ["held", "seen-failing", "free"])
    assert reconcile.candidates(adapter, resolved("replicate"), mine.id, 3) == ["free"]
    assert reconcile.candidates(SimpleNamespace(), resolved("openai"), mine.id, 3) == []
    assert other.task_id == "held"


@pytest.mark.django_db(transaction=True)  # dispatch runs on commit
def test_an_ambiguous_answer_is_looked_up_at_once_and_the_job_keeps_its_slot(owner, settings, inline_tasks):
    from queue_app.models import Job, Provider
    from queue_app.services.jobs import jobs_start
    from tests.conftest import make_drafts
    from tests.fakes.chaos_provider import ChaosProvider

    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    fake = ChaosProvider(seed=3).start()
    try:
        # Every create is accepted and its answer cut short: ambiguous to the adapter.
        fake.configure("rep-key", family="replicate", latency=(5, 6), create_faults={"malformed": 1.0})
        provider = Provider(owner=owner, name="r", family="replicate", base_url=f"{fake.url}/v1", concurrency=1)
        provider.api_key = "rep-key"
        provider.save()
        project = make_project(owner, provider, model="black-forest-labs/flux-schnell")
        [job] = make_drafts(project, prompt="chaos-job-1 a fox")
        jobs_start(user=owner, project=project, all_drafts=True)
        inline_tasks.run()
        job = Job.objects.get(id=job.id)
        [prediction] = fake.predictions
        assert fake.create_outcomes() == {"malformed": 1}
    finally:
        fake.stop()
    # Adopted by the attempt that got the ambiguous answer: detached, its slot kept.
    assert (job.status, job.task_id, job.attempts) == (Status.PROCESSING, prediction, 1)
    assert list(JobAttempt.objects.filter(job=job).values_list("outcome", "task_id")) == [("detached", prediction)]


def test_an_ambiguous_answers_own_lookup_is_tried_again_before_the_slot_is_given_up(owner, monkeypatch):
    from queue_app.providers.base import TransientError

    monkeypatch.setattr(reconcile.time, "sleep", lambda seconds: None)
    project = make_project(owner, make_provider(owner))
    job = make_job(project, Status.PROCESSING)
    attempt = _attempt(job, 1, Outcome.RUNNING)
    answers = [TransientError("503"), TransientError("reset"), ["t1"]]

    def find_submitted(request, tag, since):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    request = resolved("replicate", tag=reconcile.tag(job.id, 1))
    assert reconcile.own(SimpleNamespace(find_submitted=find_submitted), request, job.id, attempt) == ["t1"]
    answers[:] = [TransientError("503")] * 3
    assert reconcile.own(SimpleNamespace(find_submitted=find_submitted), request, job.id, attempt) == []
    assert answers == []  # three tries, then the next attempt looks again


def test_an_earlier_attempts_lookup_is_tried_again_while_the_job_keeps_its_slot(owner, monkeypatch):
    # The lost task may still be running at the provider: a requeue on the first failed
    # lookup would free the slot for another job while it runs (a call over the limit).
    from queue_app.providers.base import TransientError

    monkeypatch.setattr(reconcile.time, "sleep", lambda seconds: None)
    project = make_project(owner, make_provider(owner))
    job = make_job(project, Status.PROCESSING)
    _attempt(job, 1, Outcome.INTERRUPTED)
    answers = [TransientError("malformed"), ["t1"]]

    def find_submitted(request, tag, since):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    adapter = SimpleNamespace(find_submitted=find_submitted)
    assert reconcile.candidates(adapter, resolved("replicate"), job.id, 2) == ["t1"]
    answers[:] = [TransientError("503")] * 3
    with pytest.raises(TransientError):
        reconcile.candidates(adapter, resolved("replicate"), job.id, 2)
    assert answers == []  # three tries, then the retry asks again
