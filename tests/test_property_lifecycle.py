"""The job lifecycle as a Hypothesis state machine, over the real services and database.

Rules drive what users, workers, providers and the queue service do — create, start,
claim, run a worker task with each provider outcome, heartbeat, crash (a lease expires
and the worker's task is gone), heal, poll, retry, clear each scope, change concurrency,
pause — in any order. After every step the invariants must hold:

- every status change a job went through (read from the live-event log, which each
  transition writes in its own transaction) is an allowed transition, and the log ends at
  the job's current status;
- per provider: processing jobs hold distinct slots, never more than the concurrency
  (a lowered limit only lets the excess drain, never grow);
- album outputs are unique per (job, output index); every completed job has its output;
- a scoped clear never touches another scope;
- attempts never exceed the provider's maximum.
"""

import itertools
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db.models import Count
from django.utils import timezone
from django.utils.module_loading import import_string
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from queue_app.engine import dispatch, leases
from queue_app.models import AlbumItem, Job, ProjectEvent, Provider, Status
from queue_app.queue_service import recovery
from queue_app.services.drafts import jobs_create_drafts
from queue_app.services.jobs import failed_jobs_clear, failed_scope, jobs_retry, jobs_start
from queue_app.services.providers import provider_set_concurrency, provider_set_paused
from tests.conftest import make_project, make_provider, make_user
from tests.engine_helpers import poll_once

pytestmark = pytest.mark.django_db(transaction=True)

EVENT_STATUS = {
    "job.drafted": Status.DRAFT,
    "job.started": Status.PENDING,
    "job.retried": Status.PENDING,
    "job.requeued": Status.PENDING,
    "job.healed": Status.PENDING,
    "job.claimed": Status.PROCESSING,
    "job.detached": Status.PROCESSING,
    "job.completed": Status.COMPLETED,
    "job.failed": Status.FAILED,
    "job.cleared": "",
    "job.deleted": "",
}
ALLOWED = {
    (None, Status.DRAFT),
    (Status.DRAFT, Status.PENDING),
    (Status.PENDING, Status.DRAFT),
    (Status.PENDING, Status.PROCESSING),
    (Status.PROCESSING, Status.PROCESSING),  # running → detached
    (Status.PROCESSING, Status.COMPLETED),
    (Status.PROCESSING, Status.FAILED),
    (Status.PROCESSING, Status.PENDING),  # requeue, heal
    (Status.FAILED, Status.PENDING),  # retry
    (Status.FAILED, ""),  # clear
    (Status.DRAFT, ""),  # delete a draft
}
OUTCOMES = {
    "accept": dict(fail_rate=0, mode="sync"),
    "async": dict(fail_rate=0, mode="async"),
    "permanent": dict(fail_rate=1, fail_kind="permanent", mode="sync"),
    "transient": dict(fail_rate=1, fail_kind="transient", mode="sync"),
    "ambiguous": dict(fail_rate=1, fail_kind="ambiguous", mode="sync"),
    "rate_limit": dict(fail_rate=1, fail_kind="rate_limit", retry_after=0, mode="sync"),
}

_machines = itertools.count()
CAPTURED: list = []


class Lifecycle(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        n = next(_machines)
        CAPTURED.clear()
        self.user = make_user(get_user_model(), f"prop-{n}")
        self.providers = [
            make_provider(self.user, name=f"p{n}-a", concurrency=1),
            make_provider(self.user, name=f"p{n}-b", concurrency=2),
        ]
        Provider.objects.filter(id__in=[p.id for p in self.providers]).update(max_attempts=2)
        self.projects = [make_project(self.user, provider, name=f"project {n}-{i}") for i, provider in enumerate(self.providers)]
        self.history: dict = {}  # job id -> last status seen in the event log
        self.last_seq: dict = {project.id: 0 for project in self.projects}
        self.peak_allowed: dict = {}  # provider id -> processing count allowed now
        self.order: list = []  # job ids in creation order

    # --- helpers ------------------------------------------------------------------

    def jobs(self):
        return Job.objects.filter(owner=self.user)

    def pick(self, queryset, index):
        """The index-th matching job in creation order (ids are random UUIDs, so they
        cannot order a choice that must replay the same way)."""
        found = set(queryset.values_list("id", flat=True))
        ids = [job_id for job_id in self.order if job_id in found]
        return ids[index % len(ids)] if ids else None

    def create_drafts(self, project, quantity, provider=None):
        jobs = jobs_create_drafts(user=self.user, project=project, prompt="a lighthouse", quantity=quantity, provider=provider)
        self.order.extend(job.id for job in jobs)

    # --- users --------------------------------------------------------------------

    @initialize(quantity=st.integers(1, 4))
    def some_drafts(self, quantity):
        for project in self.projects:
            self.create_drafts(project, quantity)

    @rule(project=st.integers(0, 1), quantity=st.integers(1, 3), other_provider=st.booleans())
    def create(self, project, quantity, other_provider):
        provider = self.providers[1 - project] if other_provider else None
        self.create_drafts(self.projects[project], quantity, provider)

    @rule(project=st.integers(0, 1))
    def start_all(self, project):
        jobs_start(user=self.user, project=self.projects[project], all_drafts=True)

    @rule(index=st.integers(0, 50))
    def start_one(self, index):
        job_id = self.pick(self.jobs().filter(status__in=[Status.DRAFT, Status.FAILED]), index)
        if job_id:
            job = Job.objects.get(id=job_id)
            jobs_start(user=self.user, project=job.project, job_ids=[job_id])

    @rule(index=st.integers(0, 50))
    def retry(self, index):
        job_id = self.pick(self.jobs().filter(status=Status.FAILED), index)
        if job_id:
            assert jobs_retry(user=self.user, job_ids=[job_id])["retried"] == [str(job_id)]

    @rule(scope=st.sampled_from(["all", "project", "provider"]), index=st.integers(0, 1))
    def clear(self, scope, index):
        kwargs = {}
        if scope == "project":
            kwargs["project_id"] = self.projects[index].id
        elif scope == "provider":
            kwargs["provider_id"] = self.providers[index].id
        in_scope = set(failed_scope(user=self.user, **kwargs).values_list("id", flat=True))
        outside = set(self.jobs().filter(status=Status.FAILED).values_list("id", flat=True)) - in_scope
        result = failed_jobs_clear(user=self.user, **kwargs)
        assert result["cleared"] == len(in_scope)
        # Another scope's failed jobs are all still there, still failed.
        assert set(self.jobs().filter(id__in=outside, status=Status.FAILED).values_list("id", flat=True)) == outside
        assert not Job.objects.filter(id__in=in_scope).exists()

    @rule(provider=st.integers(0, 1), concurrency=st.integers(1, 3))
    def change_concurrency(self, provider, concurrency):
        provider_set_concurrency(user=self.user, provider_id=self.providers[provider].id, concurrency=concurrency)

    @rule(provider=st.integers(0, 1), paused=st.booleans())
    def pause(self, provider, paused):
        provider_set_paused(user=self.user, provider_id=self.providers[provider].id, paused=paused)

    # --- workers, providers, the queue service -------------------------------------

    @rule(provider=st.integers(0, 1))
    def claim(self, provider):
        dispatch.dispatch(self.providers[provider].id)

    @rule(index=st.integers(0, 50), outcome=st.sampled_from(sorted(OUTCOMES)))
    def run_task(self, index, outcome):
        """A worker picks up one enqueued task; the provider answers with `outcome`."""
        if not CAPTURED:
            return
        func, args = CAPTURED.pop(index % len(CAPTURED))
        for provider in self.providers:
            Provider.objects.filter(id=provider.id).update(options={**OUTCOMES[outcome], "latency_ms": 0})
        import_string(func)(*args)

    @rule(outcome=st.sampled_from(sorted(OUTCOMES)))
    def workers_drain(self, outcome):
        """Workers take every enqueued task (and what those tasks enqueue, up to a bound)."""
        for _ in range(20):
            if not CAPTURED:
                return
            self.run_task(0, outcome)

    @rule(index=st.integers(0, 50))
    def heartbeat(self, index):
        job_id = self.pick(self.jobs().filter(status=Status.PROCESSING, task_id=""), index)
        if job_id:
            token = Job.objects.values_list("lease_token", flat=True).get(id=job_id)
            assert leases.lease_renew(job_id, token)

    @rule(index=st.integers(0, 50))
    def crash(self, index):
        """The worker running a job dies: its task is gone and its lease runs out."""
        job_id = self.pick(self.jobs().filter(status=Status.PROCESSING, task_id=""), index)
        if not job_id:
            return
        CAPTURED[:] = [(func, args) for func, args in CAPTURED if args[0] != str(job_id)]
        Job.objects.filter(id=job_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    @rule()
    def heal(self):
        recovery.heal(include_dead_owners=False)

    @rule()
    def poll(self):
        self.jobs().filter(status=Status.PROCESSING).exclude(task_id="").update(next_poll_at=timezone.now())
        poll_once(parallelism=1)

    @rule()
    def safety_net(self):
        dispatch.ping_safety_net()

    # --- invariants ---------------------------------------------------------------

    @invariant()
    def only_allowed_transitions(self):
        for project in self.projects:
            events = ProjectEvent.objects.filter(project=project, seq__gt=self.last_seq[project.id]).order_by("seq")
            for event in events.values("seq", "kind", "job_id"):
                self.last_seq[project.id] = event["seq"]
                if event["kind"] not in EVENT_STATUS or event["job_id"] is None:
                    continue
                new = EVENT_STATUS[event["kind"]]
                old = self.history.get(event["job_id"])
                assert (old, new) in ALLOWED, f"{event['kind']}: {old} → {new!r} for job {event['job_id']}"
                self.history[event["job_id"]] = new
        current = dict(self.jobs().values_list("id", "status"))
        for job_id, status in self.history.items():
            assert current.get(job_id, "") == status, f"job {job_id}: log says {status!r}, row says {current.get(job_id)}"

    @invariant()
    def slots_match_processing_jobs_within_concurrency(self):
        for provider in Provider.objects.filter(id__in=[p.id for p in self.providers]):
            slots = list(Job.objects.filter(active_provider=provider, status=Status.PROCESSING).values_list("slot", flat=True))
            assert len(slots) == len(set(slots)), f"two jobs in one slot of {provider}"
            allowed = max(provider.concurrency, min(self.peak_allowed.get(provider.id, 0), len(slots)))
            assert len(slots) <= allowed, f"{len(slots)} processing on {provider} (concurrency {provider.concurrency})"
            self.peak_allowed[provider.id] = len(slots)
        assert not self.jobs().exclude(status=Status.PROCESSING).filter(slot__isnull=False).exists()

    @invariant()
    def album_outputs_unique_and_present(self):
        per_output = AlbumItem.objects.filter(owner=self.user).values("job_id", "output_index").annotate(n=Count("id"))
        assert all(row["n"] == 1 for row in per_output)
        completed = set(self.jobs().filter(status=Status.COMPLETED).values_list("id", flat=True))
        with_items = set(AlbumItem.objects.filter(job_id__in=completed).values_list("job_id", flat=True))
        assert completed == with_items

    @invariant()
    def attempts_within_maximum(self):
        assert not self.jobs().filter(attempts__gt=2).exists()


@pytest.fixture
def captured_tasks(monkeypatch, settings):
    settings.BACKOFF_BASE_SECONDS = 0
    monkeypatch.setattr("queue_app.engine.enqueue.enqueue_task", lambda func, *args: CAPTURED.append((func, args)))
    # Wake-ups dispatch right away on commit; the state machine claims explicitly too.
    yield CAPTURED
    CAPTURED.clear()


def test_job_lifecycle_state_machine(captured_tasks):
    run_state_machine_as_test(
        Lifecycle,
        settings=settings(
            max_examples=30,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
            # No explain phase: on Python 3.11 it traces every line while shrinking, which
            # turns a found failure into a timeout instead of a printed example.
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
            print_blob=True,
        ),
    )
