"""The job page (issue 12): the resolved snapshot, the outputs and layers, every attempt
numbered across retries, the remote task id, Retry for failed jobs, a fragment for live
updates — and nobody else's job."""

import re

import pytest

from queue_app.models import AlbumItem, Job, JobAttempt, Provider, Status
from queue_app.services.jobs import jobs_cancel, jobs_retry, jobs_start
from tests import procs
from tests.conftest import CHROMIUM, make_drafts, make_project, make_provider
from tests.test_browser import log_in

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def signed_in(client, owner):
    client.force_login(owner)
    return client


def run_job(client, project, inline_tasks, job):
    client.post(f"/projects/{project.id}/start", {"job": [str(job.id)]})
    inline_tasks.run()
    return Job.objects.get(id=job.id)


def test_attempt_numbers_continue_after_a_retry(signed_in, owner, inline_tasks):
    provider = make_provider(owner, fail_rate=1, fail_kind="permanent")
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    assert run_job(signed_in, project, inline_tasks, job).status == Status.FAILED
    signed_in.post(f"/jobs/{job.id}/retry")
    inline_tasks.run()
    assert Job.objects.get(id=job.id).status == Status.FAILED
    Provider.objects.filter(id=provider.id).update(options={"latency_ms": 0})
    signed_in.post(f"/jobs/{job.id}/retry")
    inline_tasks.run()
    assert Job.objects.get(id=job.id).status == Status.COMPLETED
    numbers = list(JobAttempt.objects.filter(job=job).order_by("started_at", "id").values_list("number", "outcome"))
    assert numbers == [(1, "permanent"), (2, "permanent"), (3, "completed")]
    html = signed_in.get(f"/jobs/{job.id}/").content.decode()
    assert all(f'data-attempt="{n}"' in html for n in (1, 2, 3))


def test_the_job_page_shows_the_resolved_snapshot_outputs_and_layers(signed_in, owner, inline_tasks):
    provider = make_provider(owner, name="Layered")
    project = make_project(owner, provider, model="demo-layers")
    [job] = make_drafts(project, prompt="a poster with layers")
    assert run_job(signed_in, project, inline_tasks, job).status == Status.COMPLETED
    response = signed_in.get(f"/jobs/{job.id}/")
    snapshot = dict(response.context["snapshot"])
    assert snapshot["Provider"] == "Layered" and snapshot["Model"] == "demo-layers" and snapshot["Family"] == "demo"
    [group] = response.context["outputs"]
    assert [i.role for i in group["main"]] == ["composite"] and len(group["layers"]) == 3
    html = response.content.decode()
    for item in AlbumItem.objects.filter(job=job):
        assert f'href="/album/{item.id}/file"' in html  # each output and layer, openable in the lightbox
    [attempt] = response.context["attempts"]
    assert attempt.outcome == "completed" and attempt.worker and attempt.finished_at
    assert 'data-attempt="1"' in html and attempt.worker in html


def test_a_model_alias_reads_as_the_model_it_stood_for(signed_in, owner, inline_tasks):
    provider = make_provider(owner)
    Provider.objects.filter(id=provider.id).update(model_aliases={"house": "demo-image"})
    project = make_project(owner, provider, model="house")
    [job] = make_drafts(project)
    assert run_job(signed_in, project, inline_tasks, job).status == Status.COMPLETED
    Provider.objects.filter(id=provider.id).update(model_aliases={"house": "demo-layers"})  # later edits change nothing
    snapshot = dict(signed_in.get(f"/jobs/{job.id}/").context["snapshot"])
    assert snapshot["Model"] == "house → demo-image"


def test_a_detached_job_shows_its_remote_task_id(signed_in, owner, inline_tasks):
    provider = make_provider(owner, mode="async", latency_ms=60_000)
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    job = run_job(signed_in, project, inline_tasks, job)
    assert job.status == Status.PROCESSING and job.task_id
    response = signed_in.get(f"/jobs/{job.id}/")
    assert response.context["row"]["state"] == "detached"
    html = response.content.decode()
    assert f'<code id="task-id">{job.task_id}</code>' in html
    assert 'id="job-retry"' not in html  # Retry is for failed jobs only


def test_retry_is_offered_for_a_failed_job_and_puts_it_back_in_the_queue(signed_in, project, inline_tasks):
    [failed, done] = make_drafts(project, 2)
    Job.objects.filter(id=failed.id).update(status=Status.FAILED, error="the model refused the prompt")
    Job.objects.filter(id=done.id).update(status=Status.COMPLETED)
    html = signed_in.get(f"/jobs/{failed.id}/").content.decode()
    assert 'id="job-retry"' in html and "the model refused the prompt" in html
    assert 'id="job-retry"' not in signed_in.get(f"/jobs/{done.id}/").content.decode()
    response = signed_in.post(f"/jobs/{failed.id}/retry", follow=True)
    assert Job.objects.get(id=failed.id).status in (Status.PENDING, Status.PROCESSING)  # dispatch may claim it at once
    assert "job retried" in response.content.decode()
    response = signed_in.post(f"/jobs/{done.id}/retry", follow=True)
    assert Job.objects.get(id=done.id).status == Status.COMPLETED
    assert "only a failed job can be retried" in response.content.decode()


def test_the_fragment_is_the_sections_alone(signed_in, project):
    [job] = make_drafts(project)
    html = signed_in.get(f"/jobs/{job.id}/?fragment=1").content.decode()
    assert 'id="attempts"' in html and 'id="snapshot"' in html and "<html" not in html
    assert "Settled when a worker claims the job" in html  # a draft has no snapshot yet


def _an_event_commits_during(monkeypatch, read, owner, job):
    """While the page reads its state (`read`: "module:name", where the page looks it up),
    the job is retried elsewhere (its event commits)."""
    import importlib

    module_name, name = read.split(":")
    module = importlib.import_module(module_name)
    real = getattr(module, name)

    def read_while_it_changes(*args, **kwargs):
        if Job.objects.filter(id=job.id, status=Status.FAILED).exists():
            jobs_retry(user=owner, job_ids=[job.id])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, read_while_it_changes)


@pytest.mark.parametrize(
    "where, read",
    [("job", "queue_app.selectors.jobs:job_detail"), ("project", "queue_app.web.pages:visible_providers")],
)
def test_an_event_committed_while_a_page_renders_is_replayed_to_its_socket(signed_in, owner, project, monkeypatch, where, read):
    """The page's seq is where its socket resumes: one read after the state would skip an
    event the state does not show, and the page would stay stale until the next event."""
    from queue_app.engine import events

    [job] = make_drafts(project)
    Job.objects.filter(id=job.id).update(status=Status.FAILED, error="the provider was down")
    Provider.objects.filter(id=project.provider_id).update(paused=True)
    _an_event_commits_during(monkeypatch, read, owner, job)
    response = signed_in.get(f"/jobs/{job.id}/" if where == "job" else f"/projects/{project.id}/")
    assert Job.objects.get(id=job.id).status == Status.PENDING  # the retry happened mid-render
    assert response.context["last_seq"] < events.last_seq(project.id)


def test_another_users_job_is_not_found_and_cannot_be_retried(client, outsider, project):
    [job] = make_drafts(project)
    Job.objects.filter(id=job.id).update(status=Status.FAILED)
    client.force_login(outsider)
    assert client.get(f"/jobs/{job.id}/").status_code == 404
    assert client.post(f"/jobs/{job.id}/retry").status_code == 404
    assert Job.objects.get(id=job.id).status == Status.FAILED


@pytest.mark.browser
@pytest.mark.processes
def test_the_job_page_follows_its_job_live_without_a_reload(owner, project, tmp_path):
    from playwright.sync_api import sync_playwright

    [job] = make_drafts(project)
    Job.objects.filter(id=job.id).update(status=Status.FAILED, error="the provider was down")
    web = procs.daphne(tmp_path / "logs")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            page.set_default_timeout(20_000)
            log_in(page, web.url, owner)
            page.goto(f"{web.url}/jobs/{job.id}/")
            page.wait_for_selector("body[data-live='1']")
            assert page.get_attribute("#job-summary .chip", "data-status") == "failed" and page.locator("#job-retry").count()
            page.evaluate("window.__sameDocument = 'yes'")
            # Retried elsewhere (another tab, the API): this page follows over the socket.
            jobs_retry(user=owner, job_ids=[job.id])
            # the chip changes with the event, the sections once they are read again
            page.wait_for_function("document.querySelector('#job-summary .chip').dataset.status !== 'failed'")
            page.wait_for_function("!document.querySelector('#job-retry')")
            assert page.evaluate("window.__sameDocument") == "yes"
            assert page.locator("#job-retry").count() == 0 and page.locator("#job-error").count() == 0
            browser.close()
    finally:
        web.stop()


def test_a_cancelled_job_says_cancelled_once(signed_in, owner):

    provider = make_provider(owner)
    Provider.objects.filter(id=provider.id).update(paused=True)  # the job stays pending
    project = make_project(owner, provider)
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, job_ids=[job.id])
    jobs_cancel(user=owner, job_ids=[job.id])
    html = signed_in.get(f"/jobs/{job.id}/").content.decode()
    error = html[html.index('id="job-error"') : html.index("</p>", html.index('id="job-error"'))]
    assert error.count("cancelled") == 1, error


@pytest.mark.browser
@pytest.mark.processes
def test_an_older_fragment_answering_last_does_not_stand_over_the_newer_state(owner, project, tmp_path, chromium):
    """Two events close together on a loaded server: the first event's fragment answers
    after the second's. The page must end on the newer state, not the older answer."""

    [job] = make_drafts(project)
    Job.objects.filter(id=job.id).update(status=Status.FAILED, error="the provider was down")
    Provider.objects.filter(id=project.provider_id).update(paused=True)  # the retried job stays pending
    held, fetched = [], []

    def hold_the_first_answer(route):
        fetched.append(route.request.url)
        if not held:
            held.append((route, route.fetch()))  # answered now (pending), delivered later
        else:
            route.continue_()

    web = procs.daphne(tmp_path / "logs")
    try:
        page = chromium.new_page()
        page.set_default_timeout(20_000)
        log_in(page, web.url, owner)
        page.goto(f"{web.url}/jobs/{job.id}/")
        page.wait_for_selector("body[data-live='1']")
        page.route(re.compile(r"/jobs/[^/]+/\?fragment=1$"), hold_the_first_answer)

        jobs_retry(user=owner, job_ids=[job.id])
        procs.wait_for(lambda: page.wait_for_timeout(50) or held, timeout=20, message="the first fragment request")
        jobs_cancel(user=owner, job_ids=[job.id])
        # The cancel's event reaches the page; a page that loads again while the first load
        # is in flight sends its second request now (and gets the cancelled state).
        page.wait_for_function(f"(window.__liveSeen['{job.id}'] || {{}}).status === 'failed'")
        page.wait_for_timeout(1000)
        route, answer = held[0]
        route.fulfill(response=answer)
        page.wait_for_timeout(1000)
        page.wait_for_function("document.querySelector('#job-summary .chip').dataset.status === 'failed'", timeout=10_000)
        assert "cancelled" in page.inner_text("#job-error")
        assert len(fetched) >= 2
    finally:
        web.stop()
