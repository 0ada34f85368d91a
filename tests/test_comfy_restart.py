"""ComfyUI as its users run it: an instance restart costs nothing, a long outage fails only
what the instance held, and one reference is uploaded once also when jobs start together.
Against the fake ComfyUI (tests/fakes/comfyui.py, `forget()`/`restart()` per the
17_server_restart recording); minutes are a controlled clock (`now=`)."""

import logging
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from comfy_app.models import ComfyInstance, ComfyRun, ComfyUpload
from comfy_app.runner import check, claim
from queue_app.models import AlbumItem, JobAttempt, Status
from queue_app.services.jobs import jobs_retry
from tests.fakes.comfyui import Script, png_of_size
from tests.test_comfy_runner import BINDINGS, LOADING, comfy_project, data_url, done, drive, job_of, start, wait_fake
from tests.test_comfy_runner import fake as fake  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def attempts_of(job) -> list[tuple[int, str]]:
    return list(JobAttempt.objects.filter(job_id=job.id).order_by("id").values_list("number", "outcome"))


# --- 1. a restart of the instance costs nothing -------------------------------------------


def test_prompts_a_restarted_instance_forgot_are_posted_again_as_new_attempts(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=30), Script(seconds=30))  # one running, one waiting at the restart
    a, b = start(owner, project, 2)
    inline_tasks.run()
    ids = {job_of(a).task_id, job_of(b).task_id}
    assert {p["prompt_id"] for p in fake.posted} == ids
    fake.refuse()  # ComfyUI is restarting (new custom nodes, a model swap, a crash)
    t0 = timezone.now()
    check.check_instance(instance.id, now=t0 + timedelta(seconds=2))
    assert ComfyInstance.objects.get(id=instance.id).unreachable_since is not None
    fake.forget()  # it comes back with an empty queue and history
    fake.accept()
    drive(instance, inline_tasks, done(a, b), now=t0 + timedelta(seconds=40))
    for job in (a, b):
        job = job_of(job)
        assert job.status == Status.COMPLETED and job.error == ""
        assert AlbumItem.objects.filter(job=job).count() == 1
        # the forgotten post is attempt 1, ended lost; the post again is attempt 2
        assert attempts_of(job) == [(1, "lost"), (2, "completed")]
        lost = JobAttempt.objects.get(job=job, outcome="lost")
        assert "restarted and forgot the prompt" in lost.reason
    # the same prompts, under their stored ids, were posted once more each
    assert sorted(p["prompt_id"] for p in fake.posted) == sorted(list(ids) * 2)
    assert fake.restarts == 1


def test_the_old_prompt_reappearing_after_a_repost_adds_no_second_album_item(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=30))
    [job] = start(owner, project)
    inline_tasks.run()
    fake.refuse()
    t0 = timezone.now()
    check.check_instance(instance.id, now=t0)
    fake.forget()
    fake.accept()
    drive(instance, inline_tasks, done(job), now=t0 + timedelta(seconds=30))
    job = job_of(job)
    assert job.status == Status.COMPLETED and AlbumItem.objects.filter(job=job).count() == 1
    # the first run's entry shows up after all (it was not lost): it is the same prompt
    # id and run nonce, and the job is done, so nothing more is stored
    entry = dict(fake.history[job.task_id])
    fake.history[job.task_id] = entry
    for _ in range(3):
        check.check_instance(instance.id, now=t0 + timedelta(seconds=40))
        inline_tasks.run()
    assert AlbumItem.objects.filter(job=job).count() == 1 and job_of(job).status == Status.COMPLETED


def test_a_restart_between_two_checks_is_told_by_the_prompt_counter_starting_again(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=30), Script(seconds=30))
    a, b = start(owner, project, 2)
    inline_tasks.run()
    assert [r.remote_number for r in ComfyRun.objects.order_by("remote_number")] == [0, 1]
    fake.restart()  # never seen down: only the counter (back at 0, nothing held) tells
    check.check_instance(instance.id)  # a first missing check: could be a history lag
    assert len(fake.posted) == 2
    drive(instance, inline_tasks, done(a, b))
    assert [job_of(job).status for job in (a, b)] == [Status.COMPLETED] * 2
    assert len(fake.posted) == 4 and AlbumItem.objects.filter(job__in=[a, b]).count() == 2


def test_a_forgotten_prompt_below_a_later_one_is_not_taken_for_a_restart(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.05), Script(seconds=30))
    first, second = start(owner, project, 2)
    inline_tasks.run()
    wait_fake(fake, lambda: job_of(first).task_id in fake.history)
    del fake.history[job_of(first).task_id]  # cleared at the instance; the later prompt is still held
    for _ in range(check.MISSING_GRACE_CHECKS + 1):
        check.check_instance(instance.id)
        inline_tasks.run()
    assert job_of(first).status == Status.FAILED and len(fake.posted) == 2


def test_a_history_gap_after_an_outage_is_waited_out_not_taken_for_a_restart(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=0.5, history_gap=1))
    [job] = start(owner, project)
    inline_tasks.run()
    fake.refuse()  # unreachable for a moment (the network, not a restart): it keeps its queue
    t0 = timezone.now()
    check.check_instance(instance.id, now=t0)
    fake.accept()
    check.check_instance(instance.id, now=t0 + timedelta(seconds=2))
    assert ComfyInstance.objects.get(id=instance.id).back_at == t0 + timedelta(seconds=2)
    assert job_of(job).status == Status.PROCESSING
    # the prompt, posted before the instance came back, finishes; its history entry lags
    # one read behind its leaving the queue: it is missing once, as any finishing prompt can be
    wait_fake(fake, lambda: len(fake.runs) == 1)
    check.check_instance(instance.id, now=t0 + timedelta(seconds=4))
    drive(instance, inline_tasks, done(job), now=t0 + timedelta(seconds=6))
    assert job_of(job).status == Status.COMPLETED
    assert attempts_of(job) == [(1, "completed")]
    assert len(fake.posted) == 1


def test_attempt_numbers_continue_across_a_users_retry(owner, fake, inline_tasks):

    project, instance = comfy_project(owner, fake)
    fake.plan(Script(kind="error"))
    [job] = start(owner, project)
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.FAILED
    jobs_retry(user=owner, job_ids=[job.id])
    drive(instance, inline_tasks, lambda: job_of(job).status == Status.COMPLETED)
    # One attempt per post: the failed prompt's (its check's finding ends it), then the retry's.
    assert attempts_of(job) == [(1, "permanent"), (2, "completed")]


# --- 2. a ten-minute outage fails only what was sent --------------------------------------


def test_a_ten_minute_outage_fails_the_prompts_it_held_and_never_sent_jobs_stay_pending(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.default = Script(seconds=60)
    jobs = start(owner, project, 6)
    inline_tasks.run()
    assert len(fake.posted) == 2
    fake.refuse()
    t0 = timezone.now()
    for minute in range(11):  # checks over ten minutes, on the test's clock
        check.check_instance(instance.id, now=t0 + timedelta(minutes=minute))
        inline_tasks.run()
    counts = sorted(job_of(job).status for job in jobs)
    assert counts == sorted([Status.FAILED] * 2 + [Status.PENDING] * 4)
    # still down: the runner takes no new work for it
    for seconds in (2, 4, 60):
        check.check_instance(instance.id, now=t0 + timedelta(minutes=10, seconds=seconds))
        inline_tasks.run()
        claim.claim_pending(project.id)
        inline_tasks.run()
    assert len(fake.posted) == 2 and sum(job_of(job).status == Status.PENDING for job in jobs) == 4
    fake.forget()
    fake.accept()
    fake.default = Script()
    waiting = [job for job in jobs if job_of(job).status == Status.PENDING]
    drive(instance, inline_tasks, done(*waiting), now=t0 + timedelta(minutes=12), timeout=30)
    assert [job_of(job).status for job in waiting] == [Status.COMPLETED] * 4
    assert len(fake.posted) == 6


def test_jobs_claimed_while_the_instance_was_down_go_back_to_pending_not_failed(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.refuse()
    jobs = start(owner, project, 3)
    inline_tasks.run()  # two submissions find nobody answering: never sent
    assert ComfyRun.objects.filter(job__in=jobs, phase="submitting").count() == 2
    t0 = ComfyInstance.objects.get(id=instance.id).unreachable_since
    check.check_instance(instance.id, now=t0 + timedelta(minutes=10, seconds=1))
    inline_tasks.run()
    assert [job_of(job).status for job in jobs] == [Status.PENDING] * 3
    assert [job_of(job).attempts for job in jobs] == [0, 0, 0]  # refunded: nothing was tried at ComfyUI
    assert fake.posted == []


def test_the_outage_is_logged_once_at_warning_and_its_end_once(owner, fake, inline_tasks, caplog):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=30))
    start(owner, project)
    inline_tasks.run()
    fake.refuse()
    t0 = timezone.now()
    with caplog.at_level(logging.WARNING, logger="comfy_app"):
        for seconds in range(0, 20, 2):
            check.check_instance(instance.id, now=t0 + timedelta(seconds=seconds))
        fake.accept()
        check.check_instance(instance.id, now=t0 + timedelta(seconds=22))
    down = [r for r in caplog.records if "in-flight jobs fail at" in r.getMessage() and r.levelno == logging.WARNING]
    back = [r for r in caplog.records if "answers again" in r.getMessage()]
    assert len(down) == 1 and len(back) == 1
    assert "in-flight jobs fail at" in down[0].getMessage()


# --- 3. reference uploads deduplicated under concurrency ----------------------------------


def test_two_jobs_submitted_at_once_upload_their_shared_reference_once(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake, workflow=LOADING, bindings=BINDINGS)
    fake.upload_delay = 0.3  # both submissions look before either has uploaded
    jobs = start(owner, project, 2, references=[data_url(png_of_size(2000))])
    submissions = list(inline_tasks.queue)
    inline_tasks.queue.clear()
    assert len(submissions) == 2
    from django.utils.module_loading import import_string

    barrier = threading.Barrier(2)
    errors = []

    def submit(func, args):
        try:
            barrier.wait()
            import_string(func)(*args)
        except Exception as error:  # surfaced by the assertion below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=item) for item in submissions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(fake.uploads) == 1
    images = {p["body"]["prompt"]["1"]["inputs"]["image"] for p in fake.posted}
    assert len(fake.posted) == 2 and len(images) == 1
    assert ComfyUpload.objects.filter(instance=instance).exclude(stored_as="").count() == 1
    drive(instance, inline_tasks, done(*jobs))
    assert [job_of(job).status for job in jobs] == [Status.COMPLETED] * 2


def test_an_upload_record_whose_file_is_gone_from_the_instance_is_uploaded_again(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake, workflow=LOADING, bindings=BINDINGS)
    [first] = start(owner, project, references=[data_url(png_of_size(800))])
    drive(instance, inline_tasks, done(first))
    fake.files = {key: data for key, data in fake.files.items() if key[0] != "input"}  # a new disk behind the address
    [second] = start(owner, project, references=[data_url(png_of_size(800))])
    drive(instance, inline_tasks, done(second))
    assert job_of(second).status == Status.COMPLETED and len(fake.uploads) == 2


def test_an_adopted_prompt_whose_post_was_never_recorded_is_reposted_after_a_restart(owner, fake, inline_tasks):
    """Its worker died after POST /prompt, before recording when and under which number:
    the resumed submission finds it queued and adopts it, and takes the post's time and
    ComfyUI's number then, so a restart that forgets it is still told apart from a loss."""
    from comfy_app.runner import submit

    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=30))
    [job] = start(owner, project)
    inline_tasks.run()
    ComfyRun.objects.filter(job=job).update(phase="submitting", posted_at=None, remote_number=None)
    run = ComfyRun.objects.get(job=job)
    assert submit._submit(job_of(job), job_of(job).lease_token, run, instance) is submit.Submission.ADOPTED
    run = ComfyRun.objects.get(job=job)
    assert run.phase == "remote" and run.posted_at is not None and run.remote_number == 0
    fake.restart()  # never seen down: only the counter tells
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED and len(fake.posted) == 2
