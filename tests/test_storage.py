"""Storage as a user sees it: usage against the limit on the account, project list and
project pages; what a start would reserve (25 MB per pending job); a refusal that says how
many jobs fit and where the limit is set; a quantity field that offers no more than fits."""

import pytest
from django.conf import settings
from django.utils.html import strip_tags

from queue_app.models import AccountSettings, AlbumItem, Job, Status
from queue_app.selectors.projects import storage_summary
from queue_app.services.drafts import MAX_DRAFTS_PER_REQUEST
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts

pytestmark = pytest.mark.django_db

MB = 1024 * 1024


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def set_limit(user, limit_bytes):
    AccountSettings.objects.filter(user=user).update(storage_limit_bytes=limit_bytes)


def used(project, size):
    AlbumItem.objects.create(project=project, owner=project.owner, kind="image", size=size)


def text_of(response) -> str:
    return " ".join(strip_tags(response.content.decode()).split())


def test_the_summary_counts_album_bytes_and_pending_reservations(owner, project):
    set_limit(owner, 200 * MB)
    used(project, 30 * MB)
    make_drafts(project, 2, status=Status.PENDING)
    make_drafts(project, 5)
    summary = storage_summary(owner, project=project)
    assert settings.JOB_STORAGE_ESTIMATE_BYTES == 25 * MB  # the product's rule (issue 12)
    assert (summary["used_bytes"], summary["reserved_bytes"], summary["limit_bytes"]) == (30 * MB, 50 * MB, 200 * MB)
    assert summary["fits_now"] == 4  # (200 - 30 - 50) // 25
    assert (summary["drafts"], summary["start_all_bytes"]) == (5, 125 * MB)


def test_the_account_page_shows_usage_against_the_limit(signed_in, owner, project):
    set_limit(owner, 500 * MB)
    used(project, 12 * MB)
    page = text_of(signed_in.get("/account/"))
    assert "Storage: 12 MB used of 500 MB (2%)" in page
    assert "set per user by an administrator (Admin → Account settings)" in page


def test_the_project_page_shows_what_starting_all_drafts_would_reserve(signed_in, owner, project):
    set_limit(owner, 100 * MB)
    make_drafts(project, 6)
    page = text_of(signed_in.get(f"/projects/{project.id}/"))
    assert "Starting all 6 drafts would reserve 150 MB (25 MB each)" in page
    assert "Only 4 fit now" in page
    assert "this project: 0 bytes" in page


def test_the_quantity_field_offers_no_more_than_fits(signed_in, owner, project):
    set_limit(owner, 100 * MB)
    assert signed_in.get(f"/projects/{project.id}/").context["quantity_max"] == 4
    assert 'max="4"' in signed_in.get(f"/projects/{project.id}/").content.decode()
    set_limit(owner, 10**15)
    assert signed_in.get(f"/projects/{project.id}/").context["quantity_max"] == MAX_DRAFTS_PER_REQUEST
    set_limit(owner, 0)
    assert signed_in.get(f"/projects/{project.id}/").context["quantity_max"] == 1


def test_a_refused_start_says_how_many_fit_and_where_the_limit_is_set(owner, project, inline_tasks):
    set_limit(owner, 100 * MB)
    used(project, 20 * MB)
    jobs = make_drafts(project, 10)
    with pytest.raises(ServiceError) as refused:
        jobs_start(user=owner, project=project, all_drafts=True)
    message = refused.value.message
    assert "Storage limit exceeded: 3 of these 10 job(s) fit now." in message
    assert "uses 20 MB of 100 MB" in message and "Admin → Account settings, per user" in message
    assert not Job.objects.filter(id__in=[j.id for j in jobs]).exclude(status=Status.DRAFT).exists()
    started = jobs_start(user=owner, project=project, job_ids=[j.id for j in jobs[:3]])
    assert len(started["started"]) == 3  # what the message said fits does fit


def test_the_project_list_shows_storage(signed_in, owner, project):
    set_limit(owner, 1000 * MB)
    used(project, 250 * MB)
    assert "Storage: 250 MB used of 1000 MB (25%)" in text_of(signed_in.get("/projects/"))


def test_the_output_writers_one_statement_reads_what_the_pages_read(owner, outsider, project):
    from queue_app.engine import outputs
    from tests.engine_helpers import usage_and_limit as read

    def usage_and_limit(excluding_job=None):
        return read(owner.id, excluding_job=excluding_job)

    # No settings row yet: the default limit.
    AccountSettings.objects.filter(user=owner).delete()
    assert usage_and_limit() == (0, settings.DEFAULT_STORAGE_LIMIT_BYTES)
    AccountSettings.objects.create(user=owner, storage_limit_bytes=300 * MB)
    [job] = make_drafts(project, 1)
    AlbumItem.objects.create(project=project, owner=owner, job=job, kind="image", size=7 * MB)
    used(project, 30 * MB)  # an item without a job (its job was cleared) still counts
    AlbumItem.objects.create(project=project, owner=outsider, kind="image", size=99 * MB)
    for excluding in (None, job.id):
        expected = (outputs.usage_bytes(owner.id, excluding_job=excluding), outputs.storage_limit(owner.id))
        assert usage_and_limit(excluding) == expected
    assert usage_and_limit(job.id) == (30 * MB, 300 * MB)
    assert usage_and_limit() == (37 * MB, 300 * MB)
