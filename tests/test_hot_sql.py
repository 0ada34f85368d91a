"""The hot path's written-out reads (engine/hot_sql.py) return what the ORM's would: the
same rows, in the same order, with the same values, on both databases."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.engine import dispatch, hot_sql, runners
from queue_app.models import Job, Project, Provider, Status
from tests.conftest import make_drafts, make_project, make_provider

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
    pending_now(make_drafts(comfy, 2), at=now - timedelta(minutes=9))
    pending_now(make_drafts(make_project(owner, other, name="elsewhere"), 2), at=now - timedelta(minutes=9))
    make_drafts(by_default, 2)  # drafts: not pending
    for limit in (50, 4, 1):
        orm = list(dispatch.dispatchable_jobs(provider.id).select_related("project")[:limit])
        written = hot_sql.dispatchable_with_projects(
            provider.id,
            projects=hot_sql.project_ids(provider.id),
            excluded_kinds=runners.kinds(),
            limit=limit,
            skip_locked=True,
        )
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
