"""Cancel in a real browser (Debian's Chromium through Playwright) against daphne, with the
workers and the queue service in their own processes: a running job is cancelled from its
row on the project page, the page shows it Cancelled without reloading, the freed slot
goes to the next job, and the worker's late result never reaches the album."""

import time

import pytest

from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_drafts, make_project, make_provider
from tests.test_browser import browser_page, log_in, stack  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_running_job_cancelled_from_the_project_page_leaves_no_album_item(stack, browser_page, owner):  # noqa: F811
    page, base = browser_page, stack.url
    provider = make_provider(owner, concurrency=1, latency_ms=4000)
    project = make_project(owner, provider, name="Cancel")
    running, waiting = make_drafts(project, 2)
    jobs_start(user=owner, project=project, job_ids=[running.id])
    jobs_start(user=owner, project=project, job_ids=[waiting.id])
    log_in(page, base, owner)
    page.goto(f"{base}/projects/{project.id}/")
    page.wait_for_selector("body[data-live='1']")
    page.evaluate("window.__sameDocument = 'yes'")
    page.wait_for_selector(f"#queue tr[data-job='{running.id}'][data-state='running']", timeout=30_000)
    # A worker has taken it and is calling the provider (a claim still in the broker made
    # no call, so it has no attempt to end).
    procs.wait_for(lambda: JobAttempt.objects.filter(job=running, outcome="running").exists(), timeout=30, message="the call")
    page.click(f"#queue tr[data-job='{running.id}'] button[data-cancel]")
    page.wait_for_selector(f"#queue tr[data-job='{running.id}'][data-state='cancelled']")
    # the freed slot goes to the next job at once (it runs, then completes)
    page.wait_for_selector(f"#queue tr[data-job='{waiting.id}'][data-state='running']", timeout=30_000)
    assert page.evaluate("window.__sameDocument") == "yes"  # never reloaded
    assert "1 job(s) cancelled" in page.inner_text("#flash")

    deadline = time.monotonic() + 30
    while Job.objects.get(id=waiting.id).status != Status.COMPLETED and time.monotonic() < deadline:
        time.sleep(0.2)
    job = Job.objects.get(id=running.id)
    assert job.status == Status.FAILED and job.error_class == "cancelled"
    assert Job.objects.get(id=waiting.id).status == Status.COMPLETED  # the cancelled call ended before this one
    assert not AlbumItem.objects.filter(job=job).exists()  # its late result was fenced out
    assert list(JobAttempt.objects.filter(job=job).values_list("outcome", flat=True)) == ["cancelled"]


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_jobs_ticked_on_the_monitor_stay_ticked_across_its_refresh_and_are_cancelled(stack, browser_page, owner):  # noqa: F811
    page, base = browser_page, stack.url
    provider = make_provider(owner, concurrency=1)
    provider.paused = True  # the jobs stay pending
    provider.save()
    project = make_project(owner, provider, name="Held")
    ticked, left = make_drafts(project, 2)
    jobs_start(user=owner, project=project, all_drafts=True)
    log_in(page, base, owner)
    page.goto(f"{base}/queue/")
    page.check(f"#jobs tr[data-job='{ticked.id}'] input[type=checkbox]")
    # (the monitor does not refresh under a focused control: the operator moves on)
    page.evaluate("document.activeElement.blur(); document.body.dataset.refreshed = 'before'")
    page.wait_for_function("document.body.dataset.refreshed !== 'before'", timeout=30_000)
    assert page.is_checked(f"#jobs tr[data-job='{ticked.id}'] input[type=checkbox]")  # kept across the refresh
    page.click("#cancel-selected")
    page.wait_for_selector(f"#jobs tr[data-job='{ticked.id}'][data-state='cancelled']")
    assert page.inner_text(f"#jobs tr[data-job='{ticked.id}'] .chip") == "Cancelled"
    assert Job.objects.get(id=ticked.id).error_class == "cancelled"
    assert Job.objects.get(id=left.id).status == Status.PENDING
