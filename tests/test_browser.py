"""In a real browser (Debian's Chromium through Playwright) against daphne, with the
workers and the queue service in their own processes — in the embedded default
(in-memory channel layer: daphne relays the event rows) and with Redis.

- the project page: add drafts, start them all, and watch every job reach completed
  over the WebSocket without the page reloading;
- the Queue Monitor: pause a provider and see its jobs Waiting with the reason, change
  its concurrency, clear failures through the confirmation.
"""

import pytest
from django.conf import settings

from queue_app.models import AlbumItem, Job, Provider, Status
from queue_app.services.drafts import jobs_create_drafts
from queue_app.services.jobs import jobs_start
from tests import procs
from tests.conftest import make_project, make_provider

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

MODES = [
    pytest.param("embedded", id="embedded"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]


@pytest.fixture
def stack(request, tmp_path, monkeypatch):
    """daphne + qcluster + queue service against the test database, in `mode`."""
    mode = request.param
    env = {"REDIS_URL": ""} if mode == "embedded" else {"REDIS_URL": settings.REDIS_URL}
    if mode == "embedded" and settings.REDIS_URL:
        # What the test itself starts goes to the children's broker (the database's), not
        # to a Redis list nobody reads until the claim's TTL hands the job out again.
        from django_q.conf import Conf

        monkeypatch.setattr(settings, "REDIS_URL", "")
        monkeypatch.setattr(Conf, "ORM", "default")
    env.update(HEARTBEAT_SECONDS=1, DISPATCH_SAFETY_NET_SECONDS=1)
    logs = tmp_path / "logs"
    running = []
    try:
        running.append(procs.qcluster(logs, workers=2, **env))
        running.append(procs.queue_service(logs, **env))
        web = procs.daphne(logs, **env)
        running.append(web)
        yield web
    finally:
        for proc in running:
            proc.stop()


@pytest.fixture
def browser_page(chromium):
    page = chromium.new_page()
    page.set_default_timeout(30_000)
    return page


def log_in(page, base, user):
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", "pw-" + user.username)
    page.click("main button[type=submit]")
    page.wait_for_url(f"{base}/projects/")


@pytest.mark.parametrize("stack", MODES, indirect=True)
def test_jobs_started_in_the_browser_complete_live_without_a_reload(stack, browser_page, owner):
    page, base = browser_page, stack.url
    provider = make_provider(owner, concurrency=2, latency_ms=400)
    project = make_project(owner, provider, name="Live")
    log_in(page, base, owner)
    page.goto(f"{base}/projects/{project.id}/")
    page.wait_for_selector("body[data-live='1']")
    page.evaluate("window.__sameDocument = 'yes'")
    page.fill("#draft-form textarea[name=prompt]", "a fox in the snow")
    page.fill("#draft-form input[name=quantity]", "5")
    page.click("#draft-form button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#drafts tr[data-job]').length === 5")
    page.click("#start-all")
    page.wait_for_function("document.querySelectorAll('#album figure[data-job]').length === 5", timeout=90_000)
    page.wait_for_function("!document.querySelector('#queue tr[data-job]')")
    assert page.evaluate("window.__sameDocument") == "yes"  # never reloaded
    seen = page.evaluate("window.__liveSeen")
    ids = [str(i) for i in Job.objects.filter(project=project).values_list("id", flat=True)]
    assert Job.objects.filter(project=project, status=Status.COMPLETED).count() == 5
    assert all(seen[job_id]["status"] == "completed" for job_id in ids)  # each one pushed over the socket
    assert AlbumItem.objects.filter(project=project).count() == 5


@pytest.mark.parametrize("stack", MODES, indirect=True)
def test_the_queue_monitor_pauses_changes_concurrency_and_clears_failures(stack, browser_page, owner):

    page, base = browser_page, stack.url
    provider = make_provider(owner, name="Alpha", concurrency=1, latency_ms=200)
    project = make_project(owner, provider, name="Monitored")
    log_in(page, base, owner)
    page.goto(f"{base}/queue/")
    row = page.locator(f"#providers tr[data-provider='{provider.id}']")
    row.locator("button[name=pause]").click()
    page.wait_for_selector(f"#providers tr[data-provider='{provider.id}'] .badge.paused")
    assert Provider.objects.get(id=provider.id).paused
    # drafts started while paused wait, and the monitor says why (it refreshes itself)
    jobs = jobs_create_drafts(user=owner, project=project, prompt="held", quantity=3)
    jobs_start(user=owner, project=project, all_drafts=True)
    page.wait_for_function("document.querySelectorAll('#jobs tr[data-state=waiting]').length === 3", timeout=30_000)
    assert page.locator("#jobs tr[data-state=waiting] [data-reason]").first.inner_text() == "provider paused"
    assert page.locator(f"#providers tr[data-provider='{provider.id}'] [data-count=waiting]").inner_text().startswith("3")
    # concurrency
    row = page.locator(f"#providers tr[data-provider='{provider.id}']")
    row.locator("input[name=concurrency]").fill("3")
    row.locator("input[name=concurrency]").press("Enter")
    page.wait_for_selector("text=concurrency 3")
    assert Provider.objects.get(id=provider.id).concurrency == 3
    # resume: the three run at once in the three slots and complete
    page.locator(f"#providers tr[data-provider='{provider.id}'] button[name=resume]").click()
    procs.wait_for(
        lambda: Job.objects.filter(id__in=[j.id for j in jobs], status=Status.COMPLETED).count() == 3,
        timeout=60,
        message="3 done",
    )
    # failures, cleared through the confirmation that names how many
    Job.objects.filter(id__in=[j.id for j in jobs[:2]]).update(status=Status.FAILED, error="simulated failure")
    page.goto(f"{base}/queue/")
    page.locator(f"#projects tr[data-project='{project.id}'] button", has_text="Clear failed").click()
    assert page.locator("#confirm-text [data-count]").inner_text() == "2"
    assert Job.objects.filter(status=Status.FAILED).count() == 2  # nothing cleared before confirming
    page.click("button.primary")
    page.wait_for_selector("text=2 failed job(s) cleared")
    assert not Job.objects.filter(status=Status.FAILED).exists()
