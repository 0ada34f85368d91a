"""The ComfyUI runner against the fake ComfyUI (tests/fakes/comfyui.py): the product's
documented promises, one or two tests each. Minutes are a controlled clock (`now=`)."""

import base64
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from comfy_app import client as comfy
from comfy_app import runner
from comfy_app.models import ComfyInstance, ComfyRun
from comfy_app.runner import check, claim
from comfy_app.runner.instance import acquire_driver
from queue_app.models import AlbumItem, Job, JobAttempt, Status
from queue_app.services.jobs import jobs_retry, jobs_start
from tests.conftest import make_drafts, make_project
from tests.fakes.comfyui import WORKFLOW, Script, png_of_size

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fake(fake_comfyui, settings):
    settings.COMFY_WEBSOCKET = False  # the 2 s checks alone, so each test drives them
    return fake_comfyui


def comfy_project(owner, fake, *, workflow=None, bindings=(), **fields):
    project = make_project(owner, kind="comfyui", name="Comfy")
    instance = ComfyInstance.objects.create(
        project=project, base_url=fake.url, workflow=workflow or WORKFLOW, bindings=list(bindings), **fields
    )
    return project, instance


def job_of(job) -> Job:
    return Job.objects.get(id=job.id)


def drive(instance, inline_tasks, until, *, timeout=20.0, now=None, checks=None):
    """Run the workers' tasks and the queue service's checks until `until()` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inline_tasks.run()
        result = check.check_instance(instance.id, now=now)
        if checks is not None:
            checks.append(result)
        inline_tasks.run()
        if until():
            return
        time.sleep(0.03)
    raise AssertionError("timed out driving the instance")


def start(owner, project, n=1, **fields):
    jobs = make_drafts(project, n, **fields)
    jobs_start(user=owner, project=project, all_drafts=True)
    return jobs


def done(*jobs):
    return lambda: all(job_of(job).status in (Status.COMPLETED, Status.FAILED) for job in jobs)


def wait_fake(fake, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("the fake never got there")


TWO_OUTPUTS = {
    **WORKFLOW,
    "5": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "second"}},
    "3": WORKFLOW["3"],
}


# --- the happy path and outputs ------------------------------------------------------


def test_it_runs_a_job_to_completed_with_its_output_in_the_album(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    [job] = start(owner, project)
    drive(instance, inline_tasks, done(job))
    job = job_of(job)
    assert job.status == Status.COMPLETED and job.task_id == fake.posted[0]["prompt_id"]
    item = AlbumItem.objects.get(job=job)
    assert item.kind == "image" and item.content_type == "image/png" and (item.width, item.height) == (64, 64)
    assert ComfyRun.objects.get(job=job).phase == "done"
    # One attempt: the prompt's post and its download are phases of it.
    [attempt] = JobAttempt.objects.filter(job=job)
    assert (attempt.number, attempt.phase, attempt.outcome, attempt.task_id) == (1, "collect", "completed", job.task_id)
    assert attempt.started_at <= attempt.detached_at <= attempt.collecting_at <= attempt.finished_at


def test_every_output_image_is_stored_in_workflow_order_with_an_index_per_file(owner, fake, inline_tasks):
    workflow = {"1": WORKFLOW["1"], "2": WORKFLOW["2"]}
    workflow["9"] = {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "first"}}
    workflow["3"] = {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "sub/second"}}
    project, instance = comfy_project(owner, fake, workflow=workflow)
    fake.plan(Script(images=2))
    [job] = start(owner, project)
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED
    items = list(AlbumItem.objects.filter(job=job).order_by("output_index"))
    assert [i.output_index for i in items] == [0, 1, 2, 3]
    assert ComfyRun.objects.get(job=job).output_order == ["1", "2", "9", "3"]
    # node 9 comes first in the workflow, so its two files come first (history lists "3" first)
    assert [name.split("_")[0] for name in fake.views] == ["first", "first", "second", "second"]


def test_video_is_stored_only_when_the_job_asks_for_it(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(video=True), Script(video=True))
    plain, wants_video = make_drafts(project, 2)
    Job.objects.filter(id=wants_video.id).update(params={"video": True})
    jobs_start(user=owner, project=project, all_drafts=True)
    drive(instance, inline_tasks, done(plain, wants_video))
    assert list(AlbumItem.objects.filter(job=plain).values_list("kind", flat=True)) == ["image"]
    assert sorted(AlbumItem.objects.filter(job=wants_video).values_list("kind", flat=True)) == ["image", "video"]


# --- two in flight, polling, and the next prompt while downloading ----------------------


def test_the_instance_never_holds_more_than_two_prompts(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.default = Script(seconds=0.15)
    jobs = start(owner, project, 7)
    seen = []
    drive(instance, inline_tasks, lambda: seen.append(claim.in_flight_count(project.id)) or done(*jobs)(), timeout=60)
    assert [job_of(j).status for j in jobs] == [Status.COMPLETED] * 7
    assert fake.max_in_flight == 2 and max(seen) <= 2
    assert len(fake.posted) == 7


def test_a_finished_prompt_stops_counting_so_the_next_job_is_sent_while_it_downloads(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.01), Script(seconds=5), Script(seconds=0.01))
    first, second, third = start(owner, project, 3)
    inline_tasks.run()  # the two submissions
    assert len(fake.posted) == 2 and job_of(third).status == Status.PENDING
    wait_fake(fake, lambda: len(fake.runs) == 1)
    result = check.check_instance(instance.id)
    assert result["finished"] == 1 and result["claimed"] == 1
    assert ComfyRun.objects.get(job=first).phase == "collecting" and job_of(first).status == Status.PROCESSING
    # the third job is claimed and its submission queued before the first one's download ran
    funcs = [func for func, _ in inline_tasks.queue]
    assert funcs == ["comfy_app.tasks.collect_prompt", "comfy_app.tasks.submit_prompt"]
    inline_tasks.run()
    assert job_of(first).status == Status.COMPLETED and len(fake.posted) == 3


def test_the_runner_tick_checks_each_instance_every_two_seconds(owner, fake, inline_tasks, monkeypatch):
    project, instance = comfy_project(owner, fake)
    start(owner, project)
    checked = []
    monkeypatch.setattr(runner.ComfyRunner, "_check_in_thread", lambda self, iid: checked.append(iid) or self._busy.discard(iid))
    tick_runner = runner.ComfyRunner()
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])

    class Inline:
        def submit(self, fn, *args):
            fn(*args)

    tick_runner._pool = Inline()
    tick_runner.tick()
    assert checked == [instance.id]
    clock[0] = 1001.9
    tick_runner.tick()
    assert checked == [instance.id], "checked again before two seconds passed"
    clock[0] = 1002.0
    tick_runner.tick()
    assert checked == [instance.id, instance.id]


# --- the prompt id, restarts and retries ----------------------------------------------


def test_the_prompt_id_is_stored_before_it_is_posted(owner, fake, inline_tasks, monkeypatch):
    project, instance = comfy_project(owner, fake)
    [job] = start(owner, project)
    stored_at_post = []
    original = comfy.ComfyClient.post_prompt

    def spy(self, graph, *, prompt_id, **kwargs):
        stored_at_post.append(Job.objects.get(id=job.id).task_id == prompt_id)
        return original(self, graph, prompt_id=prompt_id, **kwargs)

    monkeypatch.setattr(comfy.ComfyClient, "post_prompt", spy)
    inline_tasks.run()
    assert stored_at_post == [True]


def test_a_submission_that_died_after_posting_is_adopted_not_posted_again(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.3))
    [job] = start(owner, project)
    inline_tasks.run()
    # the worker died after POST /prompt but before recording it: back to "submitting",
    # with the lease its dead worker held
    ComfyRun.objects.filter(job=job).update(phase="submitting", posted_at=None)
    Job.objects.filter(id=job.id).update(lease_owner="otherhost:1", lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert runner.RUNNER.recover() == 1
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED
    assert len(fake.posted) == 1


def test_a_submission_that_died_before_posting_is_posted_once_with_its_stored_id(owner, fake, inline_tasks, monkeypatch):
    project, instance = comfy_project(owner, fake)
    [job] = start(owner, project)

    def die(self, *args, **kwargs):
        raise comfy.CheckFailed("ComfyUI at x dropped the connection")

    with monkeypatch.context() as patch:
        patch.setattr(comfy.ComfyClient, "post_prompt", die)
        inline_tasks.run()
    stored = job_of(job).task_id
    assert stored and fake.posted == []
    drive(instance, inline_tasks, done(job), now=timezone.now() + timedelta(seconds=60))
    assert job_of(job).status == Status.COMPLETED
    assert [p["prompt_id"] for p in fake.posted] == [stored]


# --- recovery of claims after a restart of our own processes ----------------------------


def lease_of(job) -> tuple:
    return Job.objects.values_list("lease_owner", "lease_token", "lease_expires_at").get(id=job.id)


def submissions(inline_tasks) -> list[str]:
    """The lease tokens of the submissions waiting in the broker."""
    return [args[1] for func, args in inline_tasks.queue if func == "comfy_app.tasks.submit_prompt"]


def test_recovery_leaves_a_claim_waiting_in_the_broker_to_its_worker(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    [job] = start(owner, project)  # claimed: no owner yet, its submission waits in the broker
    claimed = lease_of(job)
    assert claimed[0] == "" and claimed[2] > timezone.now() and submissions(inline_tasks) == [str(claimed[1])]
    assert runner.ComfyRunner().recover() == 1
    assert lease_of(job) == claimed
    check.check_instance(instance.id)
    assert lease_of(job) == claimed, "the check handed the waiting claim out again"
    assert submissions(inline_tasks) == [str(claimed[1])]
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED
    assert [p["prompt_id"] for p in fake.posted] == [job_of(job).task_id]


@contextmanager
def a_worker_taking_the_claim_while_the_check_reads_the_queue(monkeypatch, func, args):
    """Within the block, the check's first read of /queue starts a worker on the claim's
    task (`func(*args)`, what the broker holds), which stores the prompt id and stops
    mid-post until the block ends."""
    from django.utils.module_loading import import_string

    posting, go = threading.Event(), threading.Event()
    post, queue = comfy.ComfyClient.post_prompt, comfy.ComfyClient.queue

    def the_worker():
        try:
            import_string(func)(*args)
        finally:
            connection.close()

    worker = threading.Thread(target=the_worker)

    def post_slowly(self, graph, **kwargs):
        if threading.current_thread() is worker:
            posting.set()
            go.wait(10)
        return post(self, graph, **kwargs)

    def queue_while_the_worker_takes_the_claim(self):
        if threading.current_thread() is not worker and not worker.is_alive() and not posting.is_set():
            worker.start()
            assert posting.wait(10), "the worker never got to post"
        return queue(self)

    monkeypatch.setattr(comfy.ComfyClient, "post_prompt", post_slowly)
    monkeypatch.setattr(comfy.ComfyClient, "queue", queue_while_the_worker_takes_the_claim)
    try:
        yield
    finally:
        go.set()
        worker.join(10)


def test_a_claim_recovery_left_waiting_is_posted_once_when_its_worker_takes_it_during_a_check(
    owner, fake, inline_tasks, monkeypatch
):
    # The interleaving that posted a prompt twice when recovery adopted a waiting claim:
    # the check reads the runs, and while it asks /queue the broker hands the claim to a
    # worker, which stores the prompt id and is still posting when the check moves on.
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.05))
    [job] = start(owner, project)
    [(func, args)] = inline_tasks.queue
    inline_tasks.queue.clear()
    assert runner.ComfyRunner().recover() == 1

    with a_worker_taking_the_claim_while_the_check_reads_the_queue(monkeypatch, func, args):
        check.check_instance(instance.id)
        inline_tasks.run()  # whatever the check handed out runs while the worker is mid-post
    prompt_id = job_of(job).task_id
    assert prompt_id and [p["prompt_id"] for p in fake.posted] == [prompt_id]
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED and len(fake.posted) == 1


def test_recovery_takes_back_an_unowned_claim_whose_lease_has_ended(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.drop_next(1)  # the POST's connection drops: the submission gives its claim back (no owner, lease ended)
    [job] = start(owner, project)
    inline_tasks.run()
    given_back = lease_of(job)
    assert given_back[0] == "" and given_back[2] <= timezone.now() and fake.posted == []
    assert runner.ComfyRunner().recover() == 1
    check.check_instance(instance.id)
    [token] = submissions(inline_tasks)
    assert token != str(given_back[1])  # handed out again, the old hand-off fenced out
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED
    assert [p["prompt_id"] for p in fake.posted] == [job_of(job).task_id]


def test_recovery_takes_back_a_claim_whose_owner_died_before_its_lease_ended(owner, fake, inline_tasks):
    import socket

    project, instance = comfy_project(owner, fake)
    [job] = start(owner, project)
    inline_tasks.queue.clear()  # a worker took the submission and was killed before posting
    dead = f"{socket.gethostname()}:999999"
    Job.objects.filter(id=job.id).update(lease_owner=dead, lease_expires_at=timezone.now() + timedelta(minutes=1))
    assert runner.ComfyRunner().recover() == 1
    assert lease_of(job)[2] <= timezone.now()
    check.check_instance(instance.id)
    assert len(submissions(inline_tasks)) == 1, "the dead worker's claim was not handed out again"
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED and len(fake.posted) == 1


def test_a_check_hands_out_no_claim_that_a_worker_took_after_its_lease_ended(owner, fake, inline_tasks, monkeypatch):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.05))
    [job] = start(owner, project)
    [(func, args)] = inline_tasks.queue
    inline_tasks.queue.clear()
    # The claim's lease ran out while its task waited behind others in the broker; the
    # check reads it ended, and while it reads ComfyUI's queue a worker takes the task and
    # starts posting the prompt.
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with a_worker_taking_the_claim_while_the_check_reads_the_queue(monkeypatch, func, args):
        check.check_instance(instance.id)
        handed_out = list(inline_tasks.queue)
        inline_tasks.run()
    assert handed_out == []
    assert len(fake.posted) == 1


def test_history_entries_are_matched_to_the_run_not_just_the_prompt_id(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.5))
    [job] = start(owner, project)
    inline_tasks.run()
    prompt_id = job_of(job).task_id
    # someone else posts the same id with another workflow and it finishes first (ComfyUI
    # does not deduplicate ids): that entry is not ours
    fake.history[prompt_id] = {
        "prompt": [99, prompt_id, {}, {"client_id": "someone"}, []],
        "outputs": {},
        "status": {"status_str": "error", "completed": False, "messages": []},
    }
    entry = comfy.ComfyClient(fake.url).history(prompt_id)
    assert not check.is_ours(entry, ComfyRun.objects.get(job=job).nonce)
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED


def test_a_history_gap_is_waited_out(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(history_gap=2))
    [job] = start(owner, project)
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED and len(fake.posted) == 1


def test_a_prompt_comfyui_no_longer_knows_fails_after_a_few_checks(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=10), Script(seconds=30))
    job, later = start(owner, project, 2)
    inline_tasks.run()
    fake.interrupt_all()
    wait_fake(fake, lambda: job_of(job).task_id in fake.history)
    # someone deleted its history entry at the instance; a later prompt is still there, so
    # the instance did not restart (see test_comfy_restart for a restart)
    del fake.history[job_of(job).task_id]
    for _ in range(check.MISSING_GRACE_CHECKS):
        check.check_instance(instance.id)
        assert job_of(job).status == Status.PROCESSING
    check.check_instance(instance.id)
    job = job_of(job)
    assert job.status == Status.FAILED and "no longer knows this prompt" in job.error and job.task_id == ""
    assert len(fake.posted) == 2


# --- failures ---------------------------------------------------------------------------


def test_an_execution_error_fails_the_job_with_the_node_its_type_and_the_message(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(kind="error"))
    [job] = start(owner, project)
    drive(instance, inline_tasks, done(job))
    job = job_of(job)
    assert job.status == Status.FAILED and job.error_class == "permanent"
    assert "node 1 (EmptyImage)" in job.error and "IndexError: index 3 is out of bounds" in job.error
    assert len(fake.posted) == 1


def test_an_interrupt_is_reported_as_an_interrupt_not_an_error(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(kind="interrupt"))
    [job] = start(owner, project)
    drive(instance, inline_tasks, done(job))
    assert "interrupted on the ComfyUI instance" in job_of(job).error


def test_out_of_memory_is_retried_once(owner, fake, inline_tasks, settings):
    settings.BACKOFF_BASE_SECONDS = 0
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(kind="oom"), Script(kind="ok"))
    [job] = start(owner, project)
    drive(instance, inline_tasks, lambda: job_of(job).status == Status.COMPLETED)
    assert len(fake.posted) == 2 and job_of(job).attempts == 2


def test_out_of_memory_twice_fails_the_job(owner, fake, inline_tasks, settings):
    settings.BACKOFF_BASE_SECONDS = 0
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(kind="oom"), Script(kind="oom"))
    [job] = start(owner, project)
    drive(instance, inline_tasks, lambda: job_of(job).status == Status.FAILED)
    job = job_of(job)
    assert len(fake.posted) == 2 and "OutOfMemoryError" in job.error and "ran out of memory" in job.error


def test_a_validation_error_is_permanent_and_names_the_node_and_input(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(kind="invalid"))
    [job] = start(owner, project)
    inline_tasks.run()
    job = job_of(job)
    assert job.status == Status.FAILED and job.error_class == "permanent"
    assert "node 1 (EmptyImage) input 'width'" in job.error and "Required input is missing" in job.error
    assert len(fake.posted) == 1


def test_three_failed_checks_fail_the_job_keeping_its_prompt_id_and_a_retry_collects_it(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.3))
    [job] = start(owner, project)
    inline_tasks.run()
    fake.fail_next(3)
    for _ in range(2):
        check.check_instance(instance.id)
        assert job_of(job).status == Status.PROCESSING
    check.check_instance(instance.id)
    failed = job_of(job)
    assert failed.status == Status.FAILED and "failed 3 times in a row" in failed.error and "HTTP 500" in failed.error
    assert failed.task_id == fake.posted[0]["prompt_id"]
    wait_fake(fake, lambda: len(fake.runs) == 1)
    jobs_retry(user=owner, job_ids=[job.id])
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED
    assert len(fake.posted) == 1  # downloaded, not generated again


def test_a_check_that_succeeds_resets_the_failure_count(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=2))
    [job] = start(owner, project)
    inline_tasks.run()
    fake.drop_next(1)  # a dropped connection is a failed check, not an unreachable instance
    check.check_instance(instance.id)
    assert job_of(job).poll_failures == 1
    assert ComfyInstance.objects.get(id=instance.id).unreachable_since is None
    check.check_instance(instance.id)
    assert job_of(job).poll_failures == 0


def test_an_instance_unreachable_for_ten_minutes_fails_its_in_flight_jobs(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=30))
    [job] = start(owner, project)
    inline_tasks.run()
    fake.refuse()
    t0 = timezone.now()
    check.check_instance(instance.id, now=t0)
    check.check_instance(instance.id, now=t0 + timedelta(minutes=9, seconds=59))
    assert job_of(job).status == Status.PROCESSING
    check.check_instance(instance.id, now=t0 + timedelta(minutes=10))
    job = job_of(job)
    assert job.status == Status.FAILED
    assert "unreachable for 10 minutes" in job.error and "connection refused" in job.error
    assert "new address when it restarts" in job.error
    assert job.task_id == fake.posted[0]["prompt_id"]


def test_an_instance_that_comes_back_within_ten_minutes_carries_on(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.2))
    [job] = start(owner, project)
    inline_tasks.run()
    fake.refuse()
    t0 = timezone.now()
    check.check_instance(instance.id, now=t0)
    assert ComfyInstance.objects.get(id=instance.id).unreachable_since == t0
    fake.accept()
    drive(instance, inline_tasks, done(job), now=t0 + timedelta(minutes=9))
    assert job_of(job).status == Status.COMPLETED
    assert ComfyInstance.objects.get(id=instance.id).unreachable_since is None


def test_a_job_submitted_while_the_instance_is_down_is_posted_when_it_comes_back(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.refuse()
    [job] = start(owner, project)
    inline_tasks.run()
    assert job_of(job).status == Status.PROCESSING and ComfyRun.objects.get(job=job).phase == "submitting"
    fake.accept()
    drive(instance, inline_tasks, done(job), now=timezone.now() + timedelta(seconds=30))
    assert job_of(job).status == Status.COMPLETED and len(fake.posted) == 1


def test_a_hanging_prompt_times_out_and_is_interrupted(owner, fake, inline_tasks, settings):
    settings.JOB_PROCESSING_TIMEOUT_MS = 60_000
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(kind="hang"))
    [job] = start(owner, project)
    inline_tasks.run()
    wait_fake(fake, lambda: fake.running is not None)
    check.check_instance(instance.id, now=timezone.now() + timedelta(minutes=2))
    job = job_of(job)
    assert job.status == Status.FAILED and job.error_class == "timeout"
    wait_fake(fake, lambda: fake.running is None)  # our interrupt reached it
    assert fake.runs[0]["prompt_id"] == fake.posted[0]["prompt_id"]


# --- downloads ------------------------------------------------------------------------


def test_a_stalled_download_is_abandoned_after_the_idle_limit_and_a_retry_downloads_again(owner, fake, inline_tasks, settings):
    settings.COMFY_DOWNLOAD_IDLE_SECONDS = 0.3
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(image_bytes=300_000))
    fake.stall_downloads = 1.5
    [job] = start(owner, project)
    drive(instance, inline_tasks, done(job))
    failed = job_of(job)
    assert failed.status == Status.FAILED and "no data arrived for 0.3 s" in failed.error
    assert failed.task_id == fake.posted[0]["prompt_id"]
    fake.stall_downloads = 0
    jobs_retry(user=owner, job_ids=[job.id])
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED and len(fake.posted) == 1
    assert AlbumItem.objects.get(job=job).size == 300_000


def test_a_slow_download_that_keeps_sending_is_not_abandoned(owner, fake, inline_tasks, settings):
    settings.COMFY_DOWNLOAD_IDLE_SECONDS = 2
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(image_bytes=200_000))
    fake.stall_downloads = 0.5
    [job] = start(owner, project)
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED


# --- references and seeds -------------------------------------------------------------

LOADING = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "example.png"}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "loaded"}},
    "4": {"class_type": "KSampler", "inputs": {"seed": 5, "steps": 20, "cfg": 7.0, "model": ["9", 0]}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["9", 1]}},
    "7": {"class_type": "KSampler", "inputs": {"noise_seed": 1, "steps": 4}},
}
BINDINGS = [
    {"source": "references.0", "node": "1", "input": "image", "kind": "image"},
    {"source": "prompt", "node": "6", "input": "text", "kind": "text"},
    {"source": "params.steps", "node": "4", "input": "steps", "kind": "number"},
    {"source": "params.seed", "node": "7", "input": "noise_seed", "kind": "seed"},
]


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_an_identical_reference_is_uploaded_once_under_its_content_name(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake, workflow=LOADING, bindings=BINDINGS)
    picture = png_of_size(1000)
    jobs = start(owner, project, 3, references=[data_url(picture)])
    drive(instance, inline_tasks, done(*jobs))
    assert len(fake.uploads) == 1
    values = {p["body"]["prompt"]["1"]["inputs"]["image"] for p in fake.posted}
    assert len(values) == 1 and values.pop().startswith("remix-studio/") and len(fake.posted) == 3


def test_bound_inputs_take_the_drafts_values(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake, workflow=LOADING, bindings=BINDINGS)
    [job] = start(owner, project, references=[data_url(png_of_size(500))], params={"steps": "12", "seed": 77})
    drive(instance, inline_tasks, done(job))
    graph = fake.posted[0]["body"]["prompt"]
    assert graph["6"]["inputs"]["text"] == "a red fox 0"
    assert graph["4"]["inputs"]["steps"] == 12  # coerced to the type it replaces
    assert graph["7"]["inputs"]["noise_seed"] == 77


def test_unbound_seeds_are_rerolled_per_job_and_recorded_on_the_job(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake, workflow=LOADING, bindings=BINDINGS)
    jobs = start(owner, project, 2, references=[data_url(png_of_size(500))])
    drive(instance, inline_tasks, done(*jobs))
    seeds = [job_of(job).params["seeds"]["4.seed"] for job in jobs]
    assert seeds[0] != seeds[1] and 5 not in seeds
    posted = {p["prompt_id"]: p["body"]["prompt"]["4"]["inputs"]["seed"] for p in fake.posted}
    assert sorted(posted[job_of(job).task_id] for job in jobs) == sorted(seeds)
    assert "7.noise_seed" in job_of(jobs[0]).params["seeds"]  # a bound seed left empty is rolled too


def test_a_retry_that_generates_again_reuses_the_recorded_seed(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake, workflow=LOADING, bindings=BINDINGS)
    fake.plan(Script(kind="error"), Script())
    [job] = start(owner, project, references=[data_url(png_of_size(500))])
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.FAILED
    jobs_retry(user=owner, job_ids=[job.id])
    drive(instance, inline_tasks, lambda: job_of(job).status == Status.COMPLETED)
    first, second = (p["body"]["prompt"]["4"]["inputs"]["seed"] for p in fake.posted)
    assert first == second == job_of(job).params["seeds"]["4.seed"]


def test_a_job_without_address_or_workflow_fails_with_a_readable_reason(owner, fake, inline_tasks):
    project = make_project(owner, kind="comfyui", name="Empty")
    [job] = start(owner, project)
    inline_tasks.run()
    job = job_of(job)
    assert job.status == Status.FAILED and "no ComfyUI address is set" in job.error


# --- drivers ------------------------------------------------------------------------


def test_two_queue_services_never_drive_the_same_instance(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=5))
    start(owner, project)
    inline_tasks.run()
    assert check.check_instance(instance.id, owner="hostA:1")["driving"]
    assert not acquire_driver(instance.id, "hostB:2")
    other = check.check_instance(instance.id, owner="hostB:2")
    assert other == {"checked": 0, "finished": 0, "failed": 0, "claimed": 0, "driving": False}
    ComfyInstance.objects.filter(id=instance.id).update(driver_until=timezone.now() - timedelta(seconds=1))
    assert check.check_instance(instance.id, owner="hostB:2")["driving"]
    assert ComfyInstance.objects.get(id=instance.id).driver == "hostB:2"


def test_a_driver_whose_process_died_on_this_host_is_replaced_at_once(owner, fake):
    import socket

    project, instance = comfy_project(owner, fake)
    ComfyInstance.objects.filter(id=instance.id).update(
        driver=f"{socket.gethostname()}:999999", driver_until=timezone.now() + timedelta(minutes=1)
    )
    assert acquire_driver(instance.id, "me:1")


def test_healing_leaves_comfyui_jobs_to_their_runner(owner, fake, inline_tasks):
    from queue_app.queue_service import recovery

    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=5))
    [job] = start(owner, project)
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    assert recovery.heal() == 0
    assert job_of(job).status == Status.PROCESSING
