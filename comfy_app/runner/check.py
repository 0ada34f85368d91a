"""Check (the queue service, every CHECK_SECONDS per instance, under the per-instance
driver lease so two queue services never drive one instance): GET /queue, then GET
/history/<id> for prompts that left it. A finished prompt stops counting at once and its
download goes to a worker; then the freed places are claimed.

An instance that does not answer fails the prompts it holds only after UNREACHABLE_LIMIT
(never-sent jobs wait as pending); a refused login fails them at once; another error
counts as a failed check. Submissions and downloads whose worker is gone are handed out
again. A prompt is fine while queued or running (until the processing timeout); missing,
it gets a few checks' grace, or is posted again when the instance restarted since; failed
out of memory, it is retried once.
"""

import logging
from datetime import timedelta
from enum import StrEnum

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from comfy_app import client as comfy
from comfy_app.models import ComfyInstance, ComfyRun
from comfy_app.runner.claim import claim_pending
from comfy_app.runner.collect import hand_out_collection, start_collect
from comfy_app.runner.instance import UNREACHABLE_LIMIT, acquire_driver, client_for, mark_reachable, mark_unreachable
from queue_app.engine import backoff, enqueue, heartbeats, transitions
from queue_app.engine.attempts import OPEN, Outcome
from queue_app.models import ErrorClass, Job, Status
from queue_app.providers import crypto

log = logging.getLogger(__name__)

CHECK_FAILURE_LIMIT = 3
MISSING_GRACE_CHECKS = 3
OOM_RETRIES = 1

Phase = ComfyRun.Phase


class Where(StrEnum):
    """Where ComfyUI has a prompt (`locate`)."""

    PENDING = "pending"  # in the queue
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"
    MISSING = "missing"  # neither queued nor in the history (as ours)


class Checked(StrEnum):
    """What one check of an in-flight prompt found (`_check_run`)."""

    RUNNING = "running"
    MISSING = "missing"  # within its grace checks
    FINISHED = "finished"  # handed to a collector
    FAILED = "failed"  # the job failed or went back to pending
    ERROR = "error"  # the check failed; the job is checked again
    UNREACHABLE = "unreachable"  # the instance stopped answering: the rest wait too
    SKIPPED = "skipped"


def is_ours(entry: dict, nonce: str) -> bool:
    prompt = entry.get("prompt")
    extra = prompt[3] if isinstance(prompt, list) and len(prompt) > 3 and isinstance(prompt[3], dict) else {}
    return not nonce or extra.get("remixstudio_run") == nonce


def locate(client: comfy.ComfyClient, prompt_id: str, nonce: str) -> tuple[Where, dict | None]:
    """Where ComfyUI has our prompt, with its history entry when it has one.
    /queue is read before /history: a prompt moves from the queue to the history in one
    step at ComfyUI, so reading in this order cannot miss one that finishes in between."""
    states = client.queue()
    if prompt_id in states:
        return Where(states[prompt_id]), None
    entry = client.history(prompt_id)
    if entry is None or not is_ours(entry, nonce):
        return Where.MISSING, None
    status = entry.get("status") or {}
    if status.get("status_str") == "success" or (status.get("completed") and status.get("status_str") != "error"):
        return Where.SUCCESS, entry
    if status.get("status_str") == "error":
        return Where.ERROR, entry
    return Where.RUNNING, entry


def _fail(job: Job, reason: str, *, error_class: ErrorClass, keep_task_id: bool, outcome: Outcome | None = None) -> bool:
    """A check's finding fails the job and ends its open attempt."""
    return transitions.job_fail(
        job.id, job.lease_token, reason=reason, error_class=error_class, attempt=OPEN, outcome=outcome, keep_task_id=keep_task_id
    )


def check_instance(instance_id: int, *, now=None, owner: str | None = None) -> dict:
    """One check of an instance: every in-flight prompt's state applied, then free places
    claimed. Returns counts of what happened. Network calls only outside transactions."""
    now = now or timezone.now()
    owner = owner or heartbeats.process_name()
    result = {"checked": 0, "finished": 0, "failed": 0, "claimed": 0, "driving": False}
    if not acquire_driver(instance_id, owner):
        return result
    result["driving"] = True
    instance = ComfyInstance.objects.select_related("project").get(id=instance_id)
    runs = list(
        ComfyRun.objects.filter(project_id=instance.project_id, job__status=Status.PROCESSING)
        .exclude(phase=Phase.DONE)
        .select_related("job")
    )
    if runs or instance.unreachable_since:
        # An instance known to be down is asked even with nothing in flight: its pending
        # jobs wait for it (claim_pending), and this is how we learn it is back.
        _check_runs(instance, runs, now, result)
    result["claimed"] = len(claim_pending(instance.project_id))
    return result


def _check_runs(instance: ComfyInstance, runs: list, now, result: dict) -> None:
    remote = [run for run in runs if run.phase == Phase.REMOTE]
    try:
        client = client_for(instance)
        states = client.queue()
    except comfy.Unreachable as error:
        result["failed"] += _instance_unreachable(instance, runs, error.reason, now)
        return
    except comfy.AuthFailed as error:
        for run in runs:
            if run.phase in (Phase.REMOTE, Phase.SUBMITTING):
                result["failed"] += _fail(run.job, error.reason, error_class=ErrorClass.PERMANENT, keep_task_id=True)
        return
    except comfy.ComfyError as error:
        for run in remote:
            result["failed"] += _check_failed(run.job, error.reason)
        return
    if instance.unreachable_since:
        instance.back_at = now
        log.warning("ComfyUI instance of project %s answers again (unreachable since %s)", instance.project_id,
                    instance.unreachable_since.isoformat(timespec="seconds"))  # fmt: skip
    mark_reachable(instance, now)
    _resume_stale(runs, now)  # only once the instance answers: a retry into a dead address helps nobody
    for run in remote:
        result["checked"] += 1
        checked = _check_run(client, run, states, now, back_at=instance.back_at)
        if checked is Checked.UNREACHABLE:
            break
        result["finished"] += checked is Checked.FINISHED
        result["failed"] += checked is Checked.FAILED


def _resume_stale(runs: list, now) -> None:
    """Submissions and downloads whose worker died or gave up go back to the workers."""
    for run in runs:
        job = run.job
        if job.lease_expires_at is None or job.lease_expires_at > now:
            continue
        if run.phase == Phase.SUBMITTING:
            if job.poll_failures >= CHECK_FAILURE_LIMIT:
                _fail(
                    job,
                    f"submitting to ComfyUI failed {job.poll_failures} times in a row; {job.error or 'see the attempts'}",
                    error_class=ErrorClass.TRANSIENT,
                    keep_task_id=True,
                )
                continue
            # Read ended at the check's start: a worker may have taken the claim since
            # (it waited in the broker) and be posting its prompt now.
            hold = timedelta(seconds=settings.CLAIM_TTL_SECONDS)
            token = transitions.job_hand_out_again(job.id, job.lease_token, hold=hold, if_over=True)
            if token:
                enqueue.enqueue_task("comfy_app.tasks.submit_prompt", str(job.id), str(token))
        elif run.phase == Phase.COLLECTING:
            hand_out_collection(job.id, job.lease_token, if_over=True)


def _instance_unreachable(instance: ComfyInstance, runs: list, reason: str, now) -> int:
    """Returns how many jobs failed: none until the instance has been unreachable for
    UNREACHABLE_LIMIT."""
    mark_unreachable(instance.id, reason, now)
    since = ComfyInstance.objects.filter(id=instance.id).values_list("unreachable_since", flat=True).first() or now
    if now - since < UNREACHABLE_LIMIT:
        return 0
    minutes = int((now - since).total_seconds() // 60)
    address = crypto.origin(instance.base_url)
    message = (
        f"ComfyUI at {address} has been unreachable for {minutes} minutes ({reason.split('(')[-1].rstrip(')')}). "
        "A rented instance gets a new address when it restarts: check the address in the project's ComfyUI settings, "
        "then retry the job (a finished prompt is collected, not generated again)."
    )
    failed = 0
    for run in runs:
        if run.phase == Phase.REMOTE:
            failed += _fail(run.job, message, error_class=ErrorClass.TRANSIENT, keep_task_id=True)
        elif run.phase == Phase.SUBMITTING:
            # Never accepted by the instance: back to pending, its attempt refunded; it
            # waits with the other pending jobs until the instance answers (claim_pending).
            transitions.job_requeue(
                run.job_id,
                run.job.lease_token,
                reason=f"waiting for ComfyUI at {crypto.origin(instance.base_url)}: {reason}",
                error_class=ErrorClass.TRANSIENT,
                attempt=OPEN,
                refund_attempt=True,
            )
    return failed


def _check_failed(job: Job, reason: str) -> bool:
    """One more failed check in a row; the third fails the job and keeps its prompt id."""
    Job.objects.fenced(job.id, job.lease_token).update(poll_failures=F("poll_failures") + 1, error=reason[:2000])
    failures = Job.objects.filter(id=job.id).values_list("poll_failures", flat=True).first() or 0
    if failures < CHECK_FAILURE_LIMIT:
        return False
    return _fail(
        job,
        f"checking the prompt failed {failures} times in a row: {reason}. The prompt id is kept: "
        "retry the job to collect its result instead of generating it again.",
        error_class=ErrorClass.TRANSIENT,
        keep_task_id=True,
    )


def _check_run(client, run: ComfyRun, states: dict, now, *, back_at=None) -> Checked:
    job = run.job
    prompt_id = job.task_id
    if prompt_id in states:
        return _check_queued(client, run, states[prompt_id], now)
    try:
        entry = client.history(prompt_id)
    except comfy.Unreachable:
        return Checked.UNREACHABLE
    except comfy.ComfyError as error:
        return Checked.FAILED if _check_failed(job, error.reason) else Checked.ERROR
    if entry is None or not is_ours(entry, run.nonce):
        if run.graph and _lost_to_restart(client, run, back_at):
            return _repost(run)
        return _check_missing(run)
    status = entry.get("status") or {}
    if status.get("status_str") == "error":
        return _check_error(job, entry)
    if status.get("status_str") == "success" or status.get("completed"):
        return Checked.FINISHED if start_collect(job.id, job.lease_token, prompt_id) else Checked.SKIPPED
    return Checked.RUNNING


def _check_queued(client, run: ComfyRun, state: str, now) -> Checked:
    """The prompt is queued or running at ComfyUI: fine until the processing timeout,
    which interrupts it there and fails the job."""
    job = run.job
    Job.objects.fenced(job.id, job.lease_token).update(poll_failures=0)
    ComfyRun.objects.filter(job_id=job.id, phase=Phase.REMOTE).update(remote_state=state, missing_checks=0)
    if not run.posted_at or now - run.posted_at <= timedelta(milliseconds=settings.JOB_PROCESSING_TIMEOUT_MS):
        return Checked.RUNNING
    try:
        client.delete_queued([job.task_id]) if state == Where.PENDING else client.interrupt(job.task_id)
    except comfy.ComfyError:
        pass
    minutes = settings.JOB_PROCESSING_TIMEOUT_MS / 60000
    _fail(
        job,
        f"timed out: ComfyUI did not finish the prompt within {minutes:g} minutes; it was interrupted",
        error_class=ErrorClass.TIMEOUT,
        keep_task_id=False,
    )
    return Checked.FAILED


def _check_missing(run: ComfyRun) -> Checked:
    # Not queued and no history: ComfyUI can write the history a moment after the
    # prompt leaves the queue, so only a few checks in a row mean it is gone.
    ComfyRun.objects.filter(job_id=run.job_id).update(missing_checks=F("missing_checks") + 1)
    if run.missing_checks + 1 <= MISSING_GRACE_CHECKS:
        return Checked.MISSING
    _fail(
        run.job,
        "ComfyUI no longer knows this prompt (the instance may have restarted and lost its queue). "
        "Retry the job to run it again.",
        error_class=ErrorClass.TRANSIENT,
        keep_task_id=False,
        outcome=Outcome.LOST,
    )
    return Checked.FAILED


def _lost_to_restart(client, run: ComfyRun, back_at) -> bool:
    """Whether the instance restarted after we posted this (now forgotten) prompt, asked
    only on the second missing check in a row, past the moment where a finishing prompt's
    history can lag (a prompt that was in flight across an outage finishes like any
    other): it was seen down and back since, or its prompt counter started again below
    our prompt's number."""
    if run.missing_checks < 1:
        return False
    if back_at and run.posted_at and run.posted_at < back_at:
        return True
    if run.remote_number is None:
        return False
    try:
        highest = client.highest_number()
    except comfy.ComfyError:
        return False
    return highest is None or highest < run.remote_number


def _repost(run: ComfyRun) -> Checked:
    """ComfyUI restarted after we posted and forgot the prompt: post the stored graph
    again, under the same prompt id and nonce, as a new attempt of the same job. The
    submission finds the id missing and posts the kept graph (submit._submit); should
    the old prompt reappear after all, it is the same id and nonce, collected once."""
    job = run.job
    reason = "the ComfyUI instance restarted and forgot the prompt; it is posted again"
    hold = timedelta(seconds=settings.CLAIM_TTL_SECONDS)
    # The lost attempt ends; the post again is the job's next attempt.
    token = transitions.job_hand_out_again(job.id, job.lease_token, hold=hold, forgotten=reason)
    if token is None:
        return Checked.SKIPPED
    ComfyRun.objects.filter(job_id=job.id, phase=Phase.REMOTE).update(phase=Phase.SUBMITTING, missing_checks=0, remote_state="")
    enqueue.enqueue_task("comfy_app.tasks.submit_prompt", str(job.id), str(token))
    log.warning("job %s: %s", job.id, reason)
    return Checked.RUNNING


def _check_error(job: Job, entry: dict) -> Checked:
    """The prompt failed at ComfyUI: out of memory is retried once, the rest fail the job."""
    reason, oom = comfy.describe_failure(entry)
    if oom and job.attempts <= OOM_RETRIES:
        transitions.job_requeue(
            job.id,
            job.lease_token,
            reason=f"{reason} (out of memory: retrying once)",
            error_class=ErrorClass.TRANSIENT,
            attempt=OPEN,
            delay=backoff.delay(1),
        )
        return Checked.FAILED
    _fail(job, reason, error_class=ErrorClass.TRANSIENT if oom else ErrorClass.PERMANENT, keep_task_id=False)
    return Checked.FAILED
