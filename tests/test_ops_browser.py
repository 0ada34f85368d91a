"""The operator's view in Chromium against daphne, a real qcluster and the queue service
(embedded default): the workers page names the job a worker runs while it runs; after the
run the monitor's charts show its numbers; search finds a job by a word of its prompt; a
bulk action on "all matching" goes through its confirmation."""

import pytest

from queue_app.models import Job, JobAttempt, Provider, Status
from queue_app.services.drafts import jobs_create_drafts
from queue_app.services.jobs import jobs_start
from tests import procs, test_browser
from tests.conftest import make_drafts, make_project, make_provider

# the stack and browser fixtures of test_browser, shared (pytest finds fixtures by name)
stack = test_browser.stack
browser_page = test_browser.browser_page
log_in = test_browser.log_in

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_an_operator_watches_a_worker_then_reads_the_history_searches_and_acts_on_all_matching(stack, browser_page, owner):
    page, base = browser_page, stack.url
    slow = make_project(owner, make_provider(owner, name="Slow", latency_ms=6000), name="Coast")
    fast = make_project(owner, make_provider(owner, name="Quick", concurrency=2, latency_ms=50), name="Batch")
    [lighthouse] = jobs_create_drafts(user=owner, project=slow, prompt="a lighthouse at dusk", quantity=1)
    make_drafts(fast, 4, prompt="a paper boat")
    jobs_start(user=owner, project=slow, all_drafts=True)
    jobs_start(user=owner, project=fast, all_drafts=True)
    log_in(page, base, owner)

    # the workers page names the job while a worker runs it (it refreshes itself)
    page.goto(f"{base}/queue/workers/")
    page.wait_for_selector(f"#live-processes tr[data-job='{lighthouse.id}']", timeout=45_000)
    row = page.locator(f"#live-processes tr[data-job='{lighthouse.id}']").inner_text()
    assert "a lighthouse at dusk" in row and "running" in row
    assert JobAttempt.objects.filter(job=lighthouse, outcome="running").exists()

    procs.wait_for(lambda: Job.objects.filter(status=Status.COMPLETED).count() == 5, timeout=90, message="5 completed")
    # the history chart shows the run's numbers, and a bar's hover title carries them
    page.goto(f"{base}/queue/")
    everyone = page.locator("#history tr[data-history='all']")
    assert everyone.locator("span[data-completed]").inner_text() == "5"
    titles = page.eval_on_selector_all("#history tr[data-history='all'] svg g > title", "ts => ts.map(t => t.textContent)")
    assert len(titles) == 60
    assert sum(int(t.split(": ")[1].split(" completed")[0]) for t in titles) == 5  # the hover texts add up to the run

    # search by a word of the prompt
    page.fill("input[name=q]", "lighthouse")
    page.select_option("select[name=state]", "all")
    page.click("#job-filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#jobs tr[data-job]').length === 1")
    assert page.locator(f"#jobs tr[data-job='{lighthouse.id}']").count() == 1

    # all matching: the four boats made to fail, then retried through the confirmation
    Job.objects.filter(project=fast).update(status=Status.FAILED, error="simulated")
    page.goto(f"{base}/queue/?q=boat&state=failed")
    page.click("button[value='retry:matching']")
    assert page.locator("#confirm-text [data-count]").inner_text() == "4"
    page.click("button.primary")
    page.wait_for_selector("text=4 job(s): retry done")
    procs.wait_for(lambda: Job.objects.filter(project=fast, status=Status.COMPLETED).count() == 4, timeout=60, message="retried")

    # cancel all matching
    paused = make_provider(owner, name="Held")
    Provider.objects.filter(id=paused.id).update(paused=True)
    kites = make_project(owner, paused, name="Kites")
    make_drafts(kites, 3, prompt="a red kite")
    jobs_start(user=owner, project=kites, all_drafts=True)
    page.goto(f"{base}/queue/?q=kite&state=all")
    page.click("button[value='cancel:matching']")
    assert page.locator("#confirm-text [data-count]").inner_text() == "3"
    page.click("button.primary")
    page.wait_for_selector("text=3 job(s): cancel done")
    assert Job.objects.filter(project=kites, status=Status.FAILED, error_class="cancelled").count() == 3
