"""The hot path's written-out reads (engine/hot_sql.py) return what the ORM's would: the
same rows, in the same order, with the same values, on both databases."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queue_app.engine import dispatch, hot_sql, model_sql, runner_registry
from queue_app.models import Job, Project, Provider, Status
from tests.conftest import is_postgres, make_drafts, make_project, make_provider
from tests.engine_helpers import dispatchable_jobs, fair_order

pytestmark = pytest.mark.django_db(transaction=True)


def as_values(job):
    fields = [(f.attname, getattr(job, f.attname)) for f in Job._meta.concrete_fields]
    return fields + [(f"project.{f.attname}", getattr(job.project, f.attname)) for f in Project._meta.concrete_fields]


def pending_now(jobs, *, at, **fields):
    Job.objects.filter(id__in=[job.id for job in jobs]).update(status=Status.PENDING, queued_at=at, **fields)


def test_the_claims_candidates_are_the_orms_rows_in_its_order(owner):
    provider = make_provider(owner, concurrency=50)
    other = make_provider(owner, name="Other")
    now = timezone.now()
    by_default = make_project(owner, provider, name="default provider", resolution="2K", temperature=0.5, archived=True)
    named = make_project(owner, other, name="named on the job")
    comfy = make_project(owner, provider, name="a runner's", kind="comfyui")
    text = make_project(owner, provider, name="text", kind="text", model="demo-text")
    # Ties on queued_at fall to created_at, then id.
    pending_now(make_drafts(by_default, 3, params={"seed": 7}, references=[{"x": 1}]), at=now - timedelta(minutes=5))
    pending_now(make_drafts(named, 2), at=now - timedelta(minutes=4), provider=provider)
    pending_now(make_drafts(text, 2), at=now - timedelta(minutes=6))
    pending_now(make_drafts(by_default, 2), at=now - timedelta(minutes=7), not_before=now + timedelta(hours=1))
    pending_now(make_drafts(by_default, 1), at=now - timedelta(minutes=8), not_before=now - timedelta(seconds=1))
    pending_now(make_drafts(text, 1), at=now - timedelta(minutes=1), run_next_at=now)
    pending_now(make_drafts(comfy, 2), at=now - timedelta(minutes=9))
    pending_now(make_drafts(make_project(owner, other, name="elsewhere"), 2), at=now - timedelta(minutes=9))
    make_drafts(by_default, 2)  # drafts: not pending
    projects = hot_sql.project_ids(provider.id)
    for limit in (50, 4, 1):
        orm = fair_order(provider.id)[:limit]
        with CaptureQueriesContext(connection) as reads:
            written = hot_sql.dispatchable_with_projects(
                provider.id, projects=projects, excluded_kinds=runner_registry.kinds(), limit=limit, skip_locked=True
            )
        # Fewer than 50 are due: only then is every pending job read after the heads. SQLite
        # first reads which projects have jobs naming the provider (PostgreSQL: in-statement).
        assert len(reads.captured_queries) == (2 if limit == 50 else 1) + (0 if is_postgres() else 1)
        assert [job.id for job in written] == [job.id for job in orm]
        assert [as_values(job) for job in written] == [as_values(job) for job in orm]
    assert len(orm) == 1 and len(written) == 1
    assert len(hot_sql.dispatchable_with_projects(provider.id, projects=[], excluded_kinds=[], limit=50, skip_locked=False)) == 2


def test_the_provider_lock_reads_what_the_orm_reads_and_nothing_while_paused_or_cooling(owner):
    provider = make_provider(owner, concurrency=3, model_aliases={"a": "b"})
    locked = hot_sql.lock_provider(provider.id)
    orm = Provider.objects.get(id=provider.id)
    assert [(f.attname, getattr(locked, f.attname)) for f in Provider._meta.concrete_fields] == [
        (f.attname, getattr(orm, f.attname)) for f in Provider._meta.concrete_fields
    ]
    Provider.objects.filter(id=provider.id).update(cooldown_until=timezone.now() + timedelta(seconds=30))
    assert hot_sql.lock_provider(provider.id, shared=True) is None
    Provider.objects.filter(id=provider.id).update(cooldown_until=timezone.now() - timedelta(seconds=1))
    assert hot_sql.lock_provider(provider.id, shared=True) is not None
    Provider.objects.filter(id=provider.id).update(paused=True)
    assert hot_sql.lock_provider(provider.id) is None


def values_of(obj, skip=("id",)):
    return [(f.attname, getattr(obj, f.attname)) for f in type(obj)._meta.concrete_fields if f.attname not in skip]


def test_an_insert_from_the_models_fields_stores_what_save_stores(owner):
    from queue_app.models import AlbumItem, JobAttempt

    project = make_project(owner, make_provider(owner))
    [job] = make_drafts(project, 1)
    fields = dict(
        project_id=project.id,
        owner_id=owner.id,
        job_id=job.id,
        kind="image",
        file="album/1/x.png",
        content_type="image/png",
        size=12,
        width=3,
        metadata={"model": "m", "n": [1, None]},
        prompt="ünïcode",
    )
    written = model_sql.insert(AlbumItem(output_index=0, **fields))
    saved = AlbumItem.objects.create(output_index=1, **fields)
    assert written.pk is not None and not written._state.adding
    skip = ("id", "output_index", "created_at", "updated_at")
    assert values_of(AlbumItem.objects.get(pk=written.pk), skip) == values_of(AlbumItem.objects.get(pk=saved.pk), skip)
    assert AlbumItem.objects.get(pk=written.pk).created_at is not None
    [read] = model_sql.select(AlbumItem, job_id=job.id, output_index=0)
    assert values_of(read, ()) == values_of(AlbumItem.objects.get(pk=written.pk), ())
    attempt = model_sql.insert(JobAttempt(job=job, number=1, worker="w", owner_id=owner.id, provider_id=project.provider_id))
    assert JobAttempt.objects.get(pk=attempt.pk).outcome == JobAttempt.Outcome.RUNNING


def test_an_update_from_the_models_fields_changes_what_the_orms_would(owner):
    from django.db.models import F

    project = make_project(owner, make_provider(owner))
    first, second = make_drafts(project, 2)
    Job.objects.filter(id=first.id).update(status=Status.PENDING, attempts=2)
    # equality, and None read as IS NULL, as filter(lease_token=None)
    fence = dict(id=first.id, lease_token=None, status=Status.PENDING)
    assert model_sql.update(Job, fence, dict(error="x", progress=0.5, not_before=None)) == 1
    assert model_sql.update(Job, dict(fence, status=Status.PROCESSING), dict(error="y")) == 0
    # an expression goes through the ORM
    assert model_sql.update(Job, fence, dict(attempts=F("attempts") - 1)) == 1
    job = Job.objects.get(id=first.id)
    assert (job.error, job.progress, job.attempts) == ("x", 0.5, 1)
    assert Job.objects.get(id=second.id).error == ""


def test_many_rows_inserted_from_the_models_fields_are_what_bulk_create_stores(owner, monkeypatch):
    from queue_app.models import ProjectEvent

    project = make_project(owner, make_provider(owner))
    [job] = make_drafts(project, 1)

    def events(first_seq):
        return [
            ProjectEvent(project_id=project.id, seq=first_seq + n, kind="job.claimed", job_id=job.id, payload={"slot": n})
            for n in range(5)
        ]

    monkeypatch.setattr(model_sql, "INSERT_CHUNK", 2)  # three statements
    model_sql.insert_many(events(1))
    ProjectEvent.objects.bulk_create(events(101))
    stored = {event.seq: event for event in ProjectEvent.objects.filter(project=project)}
    skip = ("id", "seq", "created_at")
    assert [values_of(stored[n], skip) for n in range(1, 6)] == [values_of(stored[100 + n], skip) for n in range(1, 6)]
    assert all(stored[n].created_at is not None for n in range(1, 6))


@pytest.mark.skipif(not is_postgres(), reason="row locks need PostgreSQL (SQLite writes one at a time)")
def test_a_claim_passes_the_rows_other_claimers_hold_within_the_head_it_reads(owner):
    import threading

    from django.db import connections, transaction

    provider = make_provider(owner, concurrency=30)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 30)
    pending_now(jobs, at=timezone.now())
    order = [job.id for job in dispatchable_jobs(provider.id)]
    held, release = threading.Event(), threading.Event()

    def other_claimers_hold_the_oldest_twenty():
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(id__in=order[:20]).values_list("id"))
                held.set()
                release.wait(20)
        finally:
            connections["default"].close()

    thread = threading.Thread(target=other_claimers_hold_the_oldest_twenty)
    thread.start()
    try:
        assert held.wait(20)
        for margin, reads in ((25, 1), (5, 2)):  # within the head, or past it: the whole queue is read
            with transaction.atomic(), CaptureQueriesContext(connection) as captured:
                [job] = hot_sql.dispatchable_with_projects(
                    provider.id, projects=[project.id], excluded_kinds=[], limit=1, skip_locked=True, margin=margin
                )
            assert job.id == order[20]
            assert len(captured.captured_queries) == reads
    finally:
        release.set()
        thread.join(20)


def test_the_projects_read_by_the_candidates_statement_are_the_ones_passed_in(owner):
    provider = make_provider(owner, concurrency=10)
    now = timezone.now()
    for n in range(3):
        project = make_project(owner, provider, name=f"p{n}")
        pending_now(make_drafts(project, 2), at=now - timedelta(minutes=n))
    pending_now(make_drafts(make_project(owner, make_provider(owner, name="Other"), name="elsewhere"), 2), at=now)
    passed = hot_sql.project_ids(provider.id)
    for limit in (4, 10):
        claim = dict(excluded_kinds=[], limit=limit, skip_locked=True)
        given = hot_sql.dispatchable_with_projects(provider.id, projects=passed, **claim)
        with CaptureQueriesContext(connection) as reads:
            read = hot_sql.dispatchable_with_projects(provider.id, projects=None, **claim)
        assert [as_values(job) for job in read] == [as_values(job) for job in given]
        # PostgreSQL reads the projects within the heads' statement (LATERAL): from the heads
        # alone when they hold `limit`; else the projects, then the whole queue. SQLite reads
        # the projects and those whose jobs name the provider first.
        expected = (1 if limit == 4 else 3) if is_postgres() else (3 if limit == 4 else 4)
        assert len(reads.captured_queries) == expected
    assert len(read) == 6


def test_the_shared_provider_lock_counts_its_busy_slots(owner):
    from django.db import transaction

    provider = make_provider(owner, concurrency=4)
    project = make_project(owner, provider)
    jobs = make_drafts(project, 3)
    pending_now(jobs, at=timezone.now())
    with transaction.atomic():
        assert hot_sql.lock_provider(provider.id, shared=True).busy_slots == 0
    assert len(dispatch.dispatch(provider.id)) == 3
    Job.objects.filter(id=jobs[0].id).update(status=Status.COMPLETED, active_provider=None, slot=None)
    with transaction.atomic():
        assert hot_sql.lock_provider(provider.id, shared=True).busy_slots == 2


def test_the_output_writers_read_is_the_fenced_row_the_quota_and_whether_items_exist(owner, outsider):
    from queue_app.engine import outputs
    from queue_app.models import AccountSettings, AlbumItem, fence

    AccountSettings.objects.update_or_create(user=owner, defaults=dict(storage_limit_bytes=10_000))
    provider = make_provider(owner)
    project = make_project(owner, provider)
    job, other = make_drafts(project, 2)
    Job.objects.filter(id=job.id).update(status=Status.PROCESSING, lease_token=uuid_of(1))
    AlbumItem.objects.create(project=project, owner=owner, job=other, kind="image", size=700)
    AlbumItem.objects.create(project=project, owner=outsider, kind="image", size=99)
    locked, used, limit, has_items = hot_sql.job_to_complete(fence(job.id, uuid_of(1)))
    assert values_of(locked, ()) == values_of(Job.objects.get(id=job.id), ())
    assert (used, limit, has_items) == (outputs.usage_bytes(owner.id, excluding_job=job.id), 10_000, False)
    AlbumItem.objects.create(project=project, owner=owner, job=job, kind="image", size=5)
    _, used, _, has_items = hot_sql.job_to_complete(fence(job.id, uuid_of(1)))
    assert (used, has_items) == (700, True)  # its own items do not count against it
    assert hot_sql.job_to_complete(fence(job.id, uuid_of(2))) is None
    AccountSettings.objects.filter(user=owner).delete()
    assert hot_sql.job_to_complete(fence(job.id, uuid_of(1)))[2] == outputs.storage_limit(owner.id)


def uuid_of(n: int):
    import uuid

    return uuid.UUID(int=n)


def test_an_attempt_numbered_in_its_insert_follows_the_highest_number_of_its_job(owner):
    from queue_app.models import JobAttempt

    project = make_project(owner, make_provider(owner))
    [job, other] = make_drafts(project, 2)
    JobAttempt.objects.create(job=other, number=7, worker="w")  # another job's numbers are its own
    numbers = [hot_sql.insert_attempt(JobAttempt(job=job, worker="w", owner_id=owner.id)).number for _ in range(3)]
    assert numbers == [1, 2, 3]
    assert list(JobAttempt.objects.filter(job=job).order_by("id").values_list("number", flat=True)) == [1, 2, 3]


@pytest.mark.parametrize("counted", [0, 5], ids=["first events", "counters running"])
def test_events_of_several_projects_are_numbered_on_from_each_counter_and_stored_as_numbered(owner, counted):
    from django.db import transaction

    from queue_app.engine import events
    from queue_app.models import EventCounter, ProjectEvent

    provider = make_provider(owner)
    first, second = make_project(owner, provider, name="a"), make_project(owner, provider, name="b")
    if counted:
        EventCounter.objects.create(project=first, last=counted)
    [job] = make_drafts(first, 1)
    with transaction.atomic():
        rows = events.emit_grouped(
            [
                (second.id, "job.claimed", job.id, Status.PROCESSING, {"slot": 1}),
                (first.id, "job.completed", job.id, Status.COMPLETED, {}),
                (second.id, "job.failed", None, "", {"error": "x"}),
                (first.id, "job.claimed", job.id, Status.PROCESSING, {"slot": 0}),
            ]
        )
    in_hand = [(row.project_id, row.seq, row.kind) for row in rows]
    assert in_hand == [
        (first.id, counted + 1, "job.completed"),
        (first.id, counted + 2, "job.claimed"),
        (second.id, 1, "job.claimed"),
        (second.id, 2, "job.failed"),
    ]
    stored = ProjectEvent.objects.order_by("project_id", "seq")
    assert [(e.project_id, e.seq, e.kind, e.job_id, e.status, e.payload) for e in stored] == [
        (row.project_id, row.seq, row.kind, row.job_id, row.status, row.payload) for row in rows
    ]
    assert all(e.created_at is not None for e in stored)
    assert dict(EventCounter.objects.values_list("project_id", "last")) == {first.id: counted + 2, second.id: 2}


def _prepared_here() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.skipif(not is_postgres(), reason="prepared statements are PostgreSQL's")
def test_a_hot_statement_run_again_is_prepared_and_answers_as_before(owner, settings):
    provider = make_provider(owner, concurrency=5)
    jobs = make_drafts(make_project(owner, provider), 5)
    Job.objects.filter(id__in=[job.id for job in jobs]).update(status=Status.PENDING, queued_at=timezone.now())
    read = [hot_sql.lock_provider(provider.id, shared=True) for _ in range(model_sql.PREPARE_FROM_USE + 1)]
    assert [row.busy_slots for row in read] == [0] * len(read)
    prepared = _prepared_here()
    assert any("busy_slots" in sql for sql in prepared), prepared
    # The claim's candidates are planned for their values each time (a generic plan walked
    # the pending jobs).
    for _ in range(model_sql.PREPARE_FROM_USE + 1):
        found = hot_sql.dispatchable_with_projects(provider.id, projects=None, excluded_kinds=[], limit=2, skip_locked=False)
        assert len(found) == 2
    assert not any("j.queued_at" in sql for sql in _prepared_here())
    # The ORM's own statements are bound in the client, as Django sends them: none prepared.
    for _ in range(model_sql.PREPARE_FROM_USE + 1):
        assert Job.objects.filter(status=Status.PENDING).count() == 5
    assert len(_prepared_here()) == len(prepared)


@pytest.mark.skipif(not is_postgres(), reason="prepared statements are PostgreSQL's")
def test_prepare_hot_statements_off_prepares_nothing(owner, settings):
    settings.PREPARE_HOT_STATEMENTS = False
    connection.close()  # a fresh connection, as a process started with the setting has
    provider = make_provider(owner)
    for _ in range(model_sql.PREPARE_FROM_USE + 1):
        assert hot_sql.lock_provider(provider.id, shared=True).busy_slots == 0
    assert _prepared_here() == []
