"""The ComfyUI runner: each project's jobs on its own instance, two prompts in flight.

Who does what:
- claim (any process; DB only): under the instance row lock, claim the oldest pending
  jobs into the instance's free places (at most MAX_IN_FLIGHT prompts submitting or at
  ComfyUI) and enqueue their submission to the workers;
- submit (a django-q2 worker): build the graph (bindings, uploads by content hash,
  re-rolled seeds), store the prompt id we chose *before* posting it, then POST /prompt.
  A submission that dies is resolved later from ComfyUI's own /queue and /history
  (the stored id is looked up before anything is posted again);
- check (the queue service, every CHECK_SECONDS per instance, on a bounded pool, under a
  per-instance driver lease so two queue services never drive one instance): GET /queue,
  GET /history/<id> for prompts that left the queue; a finished prompt stops counting at
  once, its download is handed to a worker and the next job is claimed;
- collect (a django-q2 worker): stream the outputs (idle and total limits), then the
  queue's output writer completes the job.
A WebSocket listener per driven instance only makes checks happen sooner; the polling
alone is correct.

Every job write is fenced by the job's lease token; a job's status changes only through
`queue_app.engine.transitions`. No network call happens inside a database transaction.
"""

import logging
import os
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from comfy_app import client as comfy
from comfy_app import workflow
from comfy_app.models import ComfyInstance, ComfyRun
from queue_app import tasks as queue_tasks
from queue_app.engine import backoff, dispatch, heartbeats, outputs, transitions
from queue_app.engine.attempts import attempt_begin, attempt_finish
from queue_app.models import Job, JobAttempt, Kind, Status
from queue_app.providers import net
from queue_app.providers.base import Output
from queue_app.worker.execute import LeaseKeeper

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 2
CHECK_SECONDS = 2.0
CHECK_FAILURE_LIMIT = 3
MISSING_GRACE_CHECKS = 3
UNREACHABLE_LIMIT = timedelta(minutes=10)
OOM_RETRIES = 1
DRIVER_TTL = timedelta(seconds=20)
COLLECT_CLAIM = timedelta(seconds=60)
VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv", ".avi")
AUDIO_EXTENSIONS = (".wav", ".mp3", ".flac", ".ogg", ".m4a")

Phase = ComfyRun.Phase


def download_limits() -> tuple[float, float]:
    """(idle, total) seconds: abandoned only when no data arrives for a minute, or past 30 minutes."""
    return (
        float(settings.COMFY_DOWNLOAD_IDLE_SECONDS),
        float(settings.COMFY_DOWNLOAD_TOTAL_SECONDS),
    )


def websocket_enabled() -> bool:
    """The WebSocket accelerator (settings.COMFY_WEBSOCKET, on by default)."""
    return bool(settings.COMFY_WEBSOCKET)


def max_attempts() -> int:
    return settings.DEFAULT_MAX_ATTEMPTS


def client_for(instance: ComfyInstance) -> comfy.ComfyClient:
    return comfy.ComfyClient(instance.base_url, username=instance.username, password=instance.password)


def wants_video(job: Job, instance: ComfyInstance) -> bool:
    params = job.params or {}
    return bool(instance.include_video or params.get("video") or (job.format or "").lower() in ("mp4", "webm", "video"))


def snapshot(job: Job, instance: ComfyInstance) -> dict:
    return {
        "provider_id": None,
        "provider_name": "ComfyUI",
        "family": "comfyui",
        "kind": Kind.COMFYUI,
        "model": "workflow",
        "base_url": instance.base_url,
        "include_video": wants_video(job, instance),
        "params": dict(job.params or {}),
    }


def _enqueue(func: str, job_id, token) -> None:
    # Looked up at call time so tests can capture tasks (inline_tasks patches it).
    queue_tasks._enqueue(func, str(job_id), str(token))


# --- claim ------------------------------------------------------------------------------


def in_flight_count(project_id: int) -> int:
    """Prompts that count against the instance: processing jobs not yet finished at ComfyUI."""
    return (
        Job.objects.filter(project_id=project_id, status=Status.PROCESSING)
        .exclude(comfy_run__phase__in=[Phase.COLLECTING, Phase.DONE])
        .count()
    )


def claim(project_id: int) -> list[tuple]:
    """Claim pending jobs into the instance's free places; enqueue their submission.
    Returns [(job_id, token)]. One short transaction, no network I/O."""
    instance = ComfyInstance.objects.filter(project_id=project_id).first()
    if instance is None:
        instance, _ = ComfyInstance.objects.get_or_create(project_id=project_id)
    claimed = []
    with transaction.atomic():
        # The instance row lock (SQLite: the IMMEDIATE write lock) serialises claims for one
        # instance across processes, so the count below cannot be raced past MAX_IN_FLIGHT.
        instance = ComfyInstance.objects.select_for_update(no_key=True).filter(id=instance.id).first()
        free = MAX_IN_FLIGHT - in_flight_count(project_id)
        if free <= 0:
            return []
        candidates = (
            Job.objects.filter(project_id=project_id, status=Status.PENDING)
            .filter(Q(not_before__isnull=True) | Q(not_before__lte=Now()))
            .order_by("queued_at", "created_at", "id")[:free]
        )
        for job in candidates:
            token = transitions.job_claim_unslotted(job.id, project_id=project_id, snapshot=snapshot(job, instance), owner="")
            if token is None:
                continue
            fields = dict(project_id=project_id, phase=Phase.SUBMITTING, missing_checks=0, remote_state="", finished_at=None)
            if not job.task_id:  # a retry that kept its prompt id keeps graph and nonce to find it again
                fields.update(nonce="", graph=None, posted_at=None)
            ComfyRun.objects.update_or_create(job_id=job.id, defaults=fields)
            _enqueue("comfy_app.tasks.submit_job", job.id, token)
            claimed.append((job.id, token))
    return claimed


# --- submit (worker) --------------------------------------------------------------------


def _fenced(job_id, token):
    return Job.objects.filter(id=job_id, lease_token=token, status=Status.PROCESSING)


def _give_back(job_id, token, *, failures: bool = True) -> None:
    """A submission that could not finish: the job stays in flight (submitting) with an
    expired lease; the instance's next check resolves it from ComfyUI's own records."""
    fields = dict(lease_expires_at=Now(), lease_owner="")
    if failures:
        fields["poll_failures"] = F("poll_failures") + 1
    _fenced(job_id, token).update(**fields)


def _is_ours(entry: dict, nonce: str) -> bool:
    prompt = entry.get("prompt")
    extra = prompt[3] if isinstance(prompt, list) and len(prompt) > 3 and isinstance(prompt[3], dict) else {}
    return not nonce or extra.get("remixstudio_run") == nonce


def locate(client: comfy.ComfyClient, prompt_id: str, nonce: str) -> tuple[str, dict | None]:
    """Where ComfyUI has our prompt: ("queued"|"running"|"success"|"error"|"missing", entry).
    /queue is read before /history: a prompt moves from the queue to the history in one
    step at ComfyUI, so reading in this order cannot miss one that finishes in between."""
    states = client.queue()
    if prompt_id in states:
        return states[prompt_id], None
    entry = client.history(prompt_id)
    if entry is None or not _is_ours(entry, nonce):
        return "missing", None
    status = entry.get("status") or {}
    if status.get("status_str") == "success" or (status.get("completed") and status.get("status_str") != "error"):
        return "success", entry
    if status.get("status_str") == "error":
        return "error", entry
    return "running", entry


def submit(job_id, token) -> str:
    """Worker: submit one claimed job. Returns what happened (for tests and logs)."""
    close_old_connections()
    job = Job.objects.select_related("project").filter(id=job_id, lease_token=token, status=Status.PROCESSING).first()
    run = ComfyRun.objects.filter(job_id=job_id).first()
    if job is None or run is None or run.phase != Phase.SUBMITTING:
        return "skipped"
    attempt = attempt_begin(job, token)
    if attempt is None:
        return "skipped"
    instance = ComfyInstance.objects.get(project_id=job.project_id)
    try:
        with LeaseKeeper(job.id, token):
            result = _submit(job, token, run, instance)
    except comfy.Unreachable as error:
        _mark_unreachable(instance.id, error.reason, timezone.now())
        attempt_finish(attempt.id, JobAttempt.Outcome.TRANSIENT, error.reason)
        _give_back(job.id, token, failures=False)
        return "unreachable"
    except comfy.CheckFailed as error:
        # Possibly accepted (a dropped connection after the body was sent): the stored
        # prompt id is looked up before anything is posted again.
        attempt_finish(attempt.id, JobAttempt.Outcome.AMBIGUOUS, error.reason)
        _give_back(job.id, token)
        return "ambiguous"
    except (comfy.ComfyError, workflow.WorkflowError) as error:
        reason = error.reason if isinstance(error, comfy.ComfyError) else str(error)
        attempt_finish(attempt.id, JobAttempt.Outcome.PERMANENT, reason)
        transitions.job_fail(job.id, token, reason=reason, error_class="permanent", keep_task_id=False)
        return "rejected"
    except DatabaseError:
        log.error("database error while submitting job %s", job.id, exc_info=True)
        connection.close()
        return "error"
    except Exception as error:  # a bug or an unexpected answer: this job fails, the rest run
        log.exception("job %s: unexpected error while submitting to ComfyUI", job.id)
        reason = f"internal error while submitting to ComfyUI: {type(error).__name__}"
        attempt_finish(attempt.id, JobAttempt.Outcome.LOCAL, reason)
        transitions.job_fail(job.id, token, reason=reason, error_class="local", keep_task_id=False)
        return "error"
    prompt_id = Job.objects.filter(id=job.id).values_list("task_id", flat=True).first() or ""
    if result == "fenced":
        attempt_finish(attempt.id, JobAttempt.Outcome.LOST, "job taken before the prompt was stored")
        return result
    attempt_finish(attempt.id, JobAttempt.Outcome.DETACHED, result, task_id=prompt_id)
    if result == "collect":
        _start_collect(job.id, token, prompt_id)
    else:
        _fenced(job.id, token).update(lease_expires_at=None, lease_owner="", poll_failures=0)
    return result


def _submit(job: Job, token, run: ComfyRun, instance: ComfyInstance) -> str:
    if not instance.base_url:
        raise comfy.BadAddress("no ComfyUI address is set: add it in the project's ComfyUI settings")
    client = client_for(instance)
    if job.task_id and run.nonce:
        # A retry or a resumed submission: the prompt id was stored before it was posted.
        where, _ = locate(client, job.task_id, run.nonce)
        if where in ("queued", "pending", "running"):
            ComfyRun.objects.filter(job_id=job.id, phase=Phase.SUBMITTING).update(phase=Phase.REMOTE, remote_state=where)
            return "adopted"
        if where == "success":
            return "collect"
        if where == "missing" and run.graph:
            return _post(client, job, token, run.graph, job.task_id, run.nonce, instance)
        # failed at ComfyUI, or no graph kept: generate anew below
    validate_setup(instance)
    graph, seeds = workflow.build(instance.workflow, instance.bindings, job, upload=uploader(client))
    prompt_id, nonce = str(uuid.uuid4()), uuid.uuid4().hex
    with transaction.atomic():
        if not transitions.job_attach_task(job.id, token, task_id=prompt_id):
            return "fenced"
        order = [node for node in instance.node_order if node in graph] + [n for n in graph if n not in instance.node_order]
        ComfyRun.objects.filter(job_id=job.id).update(graph=graph, nonce=nonce, output_order=order, missing_checks=0)
        if seeds:
            params = dict(job.params or {})
            params["seeds"] = seeds
            _fenced(job.id, token).update(params=params)
    return _post(client, job, token, graph, prompt_id, nonce, instance)


def validate_setup(instance: ComfyInstance) -> None:
    if not instance.workflow:
        raise workflow.WorkflowError("no workflow is set: paste an API-format workflow in the project's ComfyUI settings")
    workflow.validate_workflow(instance.workflow)


def _post(client, job: Job, token, graph: dict, prompt_id: str, nonce: str, instance: ComfyInstance) -> str:
    answer = client.post_prompt(
        graph,
        prompt_id=prompt_id,
        client_id=instance.client_id,
        extra={"remixstudio_job": str(job.id), "remixstudio_run": nonce},
    )
    warnings = ""
    if answer.get("node_errors"):
        # Accepted with only the valid outputs (ComfyUI's partial acceptance): say so.
        warnings = comfy.describe_rejection({"node_errors": answer["node_errors"]}).replace("rejected", "dropped part of")
    ComfyRun.objects.filter(job_id=job.id, phase=Phase.SUBMITTING).update(
        phase=Phase.REMOTE, posted_at=timezone.now(), remote_state="pending", warnings=warnings
    )
    return "posted"


def uploader(client: comfy.ComfyClient):
    """Upload references under content-hash names; a file the instance holds is not sent again."""

    def upload(data: bytes, name: str, content_type: str) -> str:
        if client.has_input(name):
            return f"{comfy.UPLOAD_SUBFOLDER}/{name}"
        return client.upload(data, name, content_type=content_type)

    return upload


# --- check (queue service) --------------------------------------------------------------


def acquire_driver(instance_id: int, owner: str) -> bool:
    """The per-instance driver lease, on the database clock: only its holder checks."""
    free = Q(driver=owner) | Q(driver="") | Q(driver_until__isnull=True) | Q(driver_until__lt=Now())
    if ComfyInstance.objects.filter(id=instance_id).filter(free).update(driver=owner, driver_until=Now() + DRIVER_TTL):
        return True
    holder = ComfyInstance.objects.filter(id=instance_id).values_list("driver", flat=True).first()
    if holder and heartbeats.owner_is_dead(holder):
        return bool(
            ComfyInstance.objects.filter(id=instance_id, driver=holder).update(driver=owner, driver_until=Now() + DRIVER_TTL)
        )
    return False


def release_driver(instance_id: int, owner: str) -> None:
    ComfyInstance.objects.filter(id=instance_id, driver=owner).update(driver="", driver_until=None)


def _mark_unreachable(instance_id: int, reason: str, now) -> None:
    ComfyInstance.objects.filter(id=instance_id, unreachable_since__isnull=True).update(unreachable_since=now)
    ComfyInstance.objects.filter(id=instance_id).update(last_error=reason[:2000])


def _retoken(job_id, old_token, *, hold: timedelta) -> uuid.UUID | None:
    """A fresh lease token for re-enqueued work: the old task, if it still runs, is fenced out."""
    token = uuid.uuid4()
    if Job.objects.filter(id=job_id, lease_token=old_token, status=Status.PROCESSING).update(
        lease_token=token, lease_owner="", lease_expires_at=Now() + hold
    ):
        return token
    return None


def _start_collect(job_id, token, prompt_id: str) -> bool:
    """The prompt is done at ComfyUI: it stops counting now, and a worker downloads."""
    with transaction.atomic():
        if not ComfyRun.objects.filter(job_id=job_id, phase__in=[Phase.SUBMITTING, Phase.REMOTE]).update(
            phase=Phase.COLLECTING, finished_at=timezone.now(), remote_state="finished"
        ):
            return False
        new_token = _retoken(job_id, token, hold=COLLECT_CLAIM)
        if new_token is None:
            return False
        _enqueue("comfy_app.tasks.collect_job", job_id, new_token)
    return True


def _fail(job: Job, reason: str, *, error_class: str, keep_task_id: bool, outcome: str = JobAttempt.Outcome.PERMANENT) -> bool:
    JobAttempt.objects.create(
        job=job,
        number=job.attempts,
        worker="comfy-runner",
        task_id=job.task_id,
        finished_at=timezone.now(),
        outcome=outcome,
        reason=reason[:2000],
    )
    return transitions.job_fail(job.id, job.lease_token, reason=reason, error_class=error_class, keep_task_id=keep_task_id)


def check_instance(instance_id: int, *, now=None, owner: str | None = None) -> dict:
    """One check of an instance: every in-flight prompt's state applied, then free places
    claimed. Returns counts of what happened. Network calls only outside transactions."""
    now = now or timezone.now()
    owner = owner or dispatch.worker_name()
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
    remote = [run for run in runs if run.phase == Phase.REMOTE]
    if runs:
        try:
            client = client_for(instance)
            states = client.queue()
        except comfy.Unreachable as error:
            _instance_unreachable(instance, runs, error.reason, now, result)
            return result
        except comfy.AuthFailed as error:
            for run in runs:
                if run.phase in (Phase.REMOTE, Phase.SUBMITTING):
                    result["failed"] += _fail(run.job, error.reason, error_class="permanent", keep_task_id=True)
            return result
        except comfy.ComfyError as error:
            for run in remote:
                result["failed"] += _check_failed(run.job, error.reason)
            return result
        ComfyInstance.objects.filter(id=instance.id).update(unreachable_since=None, last_error="", last_checked_at=now)
        _resume_stale(runs, now)  # only once the instance answers: a retry into a dead address helps nobody
        for run in remote:
            result["checked"] += 1
            outcome = _check_run(client, run, states, now)
            if outcome == "unreachable":
                break
            result["finished"] += outcome == "finished"
            result["failed"] += outcome == "failed"
    result["claimed"] = len(claim(instance.project_id))
    return result


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
                    error_class="transient",
                    keep_task_id=True,
                )
                continue
            token = _retoken(job.id, job.lease_token, hold=timedelta(seconds=settings.CLAIM_TTL_SECONDS))
            if token:
                _enqueue("comfy_app.tasks.submit_job", job.id, token)
        elif run.phase == Phase.COLLECTING:
            token = _retoken(job.id, job.lease_token, hold=COLLECT_CLAIM)
            if token:
                _enqueue("comfy_app.tasks.collect_job", job.id, token)


def _instance_unreachable(instance: ComfyInstance, runs: list, reason: str, now, result: dict) -> None:
    _mark_unreachable(instance.id, reason, now)
    since = ComfyInstance.objects.filter(id=instance.id).values_list("unreachable_since", flat=True).first() or now
    if now - since < UNREACHABLE_LIMIT:
        return
    minutes = int((now - since).total_seconds() // 60)
    message = (
        f"ComfyUI at {instance.base_url} has been unreachable for {minutes} minutes ({reason.split('(')[-1].rstrip(')')}). "
        "A rented instance gets a new address when it restarts: check the address in the project's ComfyUI settings, "
        "then retry the job (a finished prompt is collected, not generated again)."
    )
    for run in runs:
        if run.phase in (Phase.REMOTE, Phase.SUBMITTING):
            result["failed"] += _fail(run.job, message, error_class="transient", keep_task_id=True, outcome="transient")


def _check_failed(job: Job, reason: str) -> bool:
    """One more failed check in a row; the third fails the job and keeps its prompt id."""
    Job.objects.filter(id=job.id, lease_token=job.lease_token, status=Status.PROCESSING).update(
        poll_failures=F("poll_failures") + 1, error=reason[:2000]
    )
    failures = Job.objects.filter(id=job.id).values_list("poll_failures", flat=True).first() or 0
    if failures < CHECK_FAILURE_LIMIT:
        return False
    return _fail(
        job,
        f"checking the prompt failed {failures} times in a row: {reason}. The prompt id is kept: "
        "retry the job to collect its result instead of generating it again.",
        error_class="transient",
        keep_task_id=True,
        outcome="transient",
    )


def _check_run(client, run: ComfyRun, states: dict, now) -> str:
    job = run.job
    prompt_id = job.task_id
    if prompt_id in states:
        state = states[prompt_id]
        Job.objects.filter(id=job.id, lease_token=job.lease_token).update(poll_failures=0)
        ComfyRun.objects.filter(job_id=job.id, phase=Phase.REMOTE).update(remote_state=state, missing_checks=0)
        timeout = timedelta(milliseconds=settings.JOB_PROCESSING_TIMEOUT_MS)
        if run.posted_at and now - run.posted_at > timeout:
            try:
                client.delete_queued([prompt_id]) if state == "pending" else client.interrupt(prompt_id)
            except comfy.ComfyError:
                pass
            minutes = settings.JOB_PROCESSING_TIMEOUT_MS / 60000
            _fail(
                job,
                f"timed out: ComfyUI did not finish the prompt within {minutes:g} minutes; it was interrupted",
                error_class="timeout",
                keep_task_id=False,
                outcome="timeout",
            )
            return "failed"
        return "running"
    try:
        entry = client.history(prompt_id)
    except comfy.Unreachable:
        return "unreachable"
    except comfy.ComfyError as error:
        return "failed" if _check_failed(job, error.reason) else "error"
    if entry is None or not _is_ours(entry, run.nonce):
        # Not queued and no history: ComfyUI can write the history a moment after the
        # prompt leaves the queue, so only a few checks in a row mean it is gone.
        ComfyRun.objects.filter(job_id=job.id).update(missing_checks=F("missing_checks") + 1)
        if run.missing_checks + 1 <= MISSING_GRACE_CHECKS:
            return "missing"
        _fail(
            job,
            "ComfyUI no longer knows this prompt (the instance may have restarted and lost its queue). "
            "Retry the job to run it again.",
            error_class="transient",
            keep_task_id=False,
            outcome="lost",
        )
        return "failed"
    status = entry.get("status") or {}
    if status.get("status_str") == "error":
        reason, oom = comfy.describe_failure(entry)
        if oom and job.attempts <= OOM_RETRIES:
            JobAttempt.objects.create(
                job=job,
                number=job.attempts,
                worker="comfy-runner",
                task_id=prompt_id,
                finished_at=timezone.now(),
                outcome="transient",
                reason=reason,
            )
            transitions.job_requeue(
                job.id,
                job.lease_token,
                reason=f"{reason} (out of memory: retrying once)",
                error_class="transient",
                delay=backoff.delay(1),
            )
            return "failed"
        _fail(job, reason, error_class="transient" if oom else "permanent", keep_task_id=False)
        return "failed"
    if status.get("status_str") == "success" or status.get("completed"):
        return "finished" if _start_collect(job.id, job.lease_token, prompt_id) else "skipped"
    return "running"


# --- collect (worker) -------------------------------------------------------------------


def output_files(entry: dict, order: list, *, include_video: bool) -> list[tuple[str, dict]]:
    """[(kind, file item)] in workflow order: every saved image of every output node (temp
    previews only when nothing was saved), then videos when the job asks for them."""
    node_outputs = entry.get("outputs") or {}
    order = [node for node in order if node in node_outputs] + [node for node in node_outputs if node not in order]
    images, previews, media = [], [], []
    for node_id in order:
        produced = node_outputs.get(node_id) or {}
        for key in ("images", "gifs", "videos", "audio"):
            for item in produced.get(key) or []:
                if not isinstance(item, dict) or not item.get("filename"):
                    continue
                name = item["filename"].lower()
                if name.endswith(VIDEO_EXTENSIONS) or key in ("gifs", "videos") and not name.endswith((".png", ".jpg", ".webp")):
                    media.append(("video", item))
                elif name.endswith(AUDIO_EXTENSIONS) or key == "audio":
                    media.append(("audio", item))
                elif item.get("type", "output") == "output":
                    images.append(("image", item))
                else:
                    previews.append(("image", item))
    files = images or ([] if media and include_video else previews)
    if include_video:
        files += [pair for pair in media if pair[0] == "video"]
    files += [pair for pair in media if pair[0] == "audio"]
    return files


class OutputGone(Exception):
    pass


def _download(client: comfy.ComfyClient, item: dict) -> tuple[bytes, str]:
    idle, total = download_limits()
    tmp_dir = Path(settings.MEDIA_ROOT) / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    handle, path = tempfile.mkstemp(dir=tmp_dir, suffix=".download")
    os.close(handle)
    try:
        try:
            _, content_type = net.stream_to_file(
                client.view_url(item), path, headers=client.download_headers(), idle_timeout=idle, total_timeout=total
            )
        except net.requests.HTTPError as error:
            if error.response is not None and error.response.status_code == 404:
                raise OutputGone(item.get("filename", "?")) from None
            raise
        return Path(path).read_bytes(), content_type
    finally:
        Path(path).unlink(missing_ok=True)


def collect(job_id, token) -> str:
    """Worker: download a finished prompt's outputs and complete the job."""
    close_old_connections()
    job = Job.objects.select_related("project").filter(id=job_id, lease_token=token, status=Status.PROCESSING).first()
    run = ComfyRun.objects.filter(job_id=job_id).first()
    if job is None or run is None or run.phase != Phase.COLLECTING:
        return "skipped"
    attempt = attempt_begin(job, token)
    if attempt is None:
        return "skipped"
    instance = ComfyInstance.objects.get(project_id=job.project_id)
    keep = "The prompt id is kept: retry the job to download the finished result again."
    try:
        with LeaseKeeper(job.id, token):
            client = client_for(instance)
            entry = None
            for delay in (0, 0.2, 0.5, 1.0):  # the history can lag the queue by a few ms
                time.sleep(delay)
                entry = client.history(job.task_id)
                if entry is not None:
                    break
            if entry is None:
                raise comfy.CheckFailed("ComfyUI has no history for the finished prompt")
            include_video = bool((job.resolved or {}).get("include_video"))
            files = output_files(entry, run.output_order or list(run.graph or {}), include_video=include_video)
            if not files:
                reason = "ComfyUI finished the prompt but the workflow saved no output files (add a SaveImage node)"
                attempt_finish(attempt.id, JobAttempt.Outcome.PERMANENT, reason)
                transitions.job_fail(job.id, token, reason=reason, error_class="permanent", keep_task_id=False)
                return "no-output"
            results = []
            for kind, item in files:
                data, content_type = _download(client, item)
                results.append(Output(kind=kind, data=data, content_type=content_type or ""))
            outputs.write_and_complete(job.id, token, results, attempt_id=attempt.id)
    except outputs.Fenced:
        attempt_finish(attempt.id, JobAttempt.Outcome.LOST, "job taken before its outputs were written")
        return "fenced"
    except OutputGone as error:
        reason = f"the output file {error} is no longer on the ComfyUI instance; retry the job to generate it again"
        attempt_finish(attempt.id, JobAttempt.Outcome.LOCAL, reason)
        transitions.job_fail(job.id, token, reason=reason, error_class="local", keep_task_id=False)
        return "gone"
    except outputs.QuotaExceeded as error:
        attempt_finish(attempt.id, JobAttempt.Outcome.LOCAL, str(error))
        transitions.job_fail(job.id, token, reason=f"{error}. {keep}", error_class="local")
        return "quota"
    except DatabaseError:
        log.error("database error while collecting job %s", job.id, exc_info=True)
        connection.close()
        return "error"
    except Exception as error:
        detail = error.reason if isinstance(error, comfy.ComfyError) else str(error) or type(error).__name__
        reason = f"downloading the result from ComfyUI failed: {detail}. {keep}"
        log.warning("job %s: %s", job.id, reason)
        attempt_finish(attempt.id, JobAttempt.Outcome.LOCAL, reason)
        transitions.job_fail(job.id, token, reason=reason, error_class="local")
        return "failed"
    ComfyRun.objects.filter(job_id=job.id).update(phase=Phase.DONE)
    return "completed"


# --- the runner object the queue consults -----------------------------------------------


class ComfyRunner:
    """Registered for kind "comfyui" in queue_app.engine.runners (see comfy_app.apps)."""

    def __init__(self):
        self._pool = None
        self._lock = threading.Lock()
        self._busy: set[int] = set()
        self._urgent: set[int] = set()
        self._last_check: dict[int, float] = {}
        self.listeners = None  # comfy_app.ws.Listeners, started with the first check

    # queue_app.engine.runners interface

    def wake(self, project_ids) -> None:
        for project_id in sorted(project_ids):
            try:
                claim(project_id)
            except Exception:
                log.warning("ComfyUI claim for project %s failed; the runner's tick retries", project_id, exc_info=True)

    def owns(self, job) -> bool:
        return job.project.kind == Kind.COMFYUI

    def recover(self) -> int:
        """Adopt in-flight work after a restart: submissions and downloads whose worker is
        gone are handed out again by the next check (their leases are expired now);
        prompts at ComfyUI are simply checked. Nothing is posted twice: a resumed
        submission looks its stored prompt id up first."""
        adopted = 0
        rows = Job.objects.filter(status=Status.PROCESSING, project__kind=Kind.COMFYUI).values_list(
            "id", "lease_owner", "lease_expires_at", "comfy_run__phase"
        )
        for job_id, lease_owner, _, phase in rows:
            adopted += 1
            if phase in (Phase.SUBMITTING, Phase.COLLECTING) and (not lease_owner or heartbeats.owner_is_dead(lease_owner)):
                Job.objects.filter(id=job_id, status=Status.PROCESSING, lease_owner=lease_owner).update(lease_expires_at=Now())
            elif phase is None:
                ComfyRun.objects.get_or_create(
                    job_id=job_id, defaults={"project_id": Job.objects.get(id=job_id).project_id, "phase": Phase.SUBMITTING}
                )
                Job.objects.filter(id=job_id).update(lease_expires_at=Now())
        for instance_id, driver in ComfyInstance.objects.exclude(driver="").values_list("id", "driver"):
            if heartbeats.owner_is_dead(driver):
                ComfyInstance.objects.filter(id=instance_id, driver=driver).update(driver="", driver_until=None)
        return adopted

    def tick(self) -> bool:
        """Schedule due checks on the bounded pool; returns at once."""
        active = set(
            Job.objects.filter(project__kind=Kind.COMFYUI, status__in=[Status.PENDING, Status.PROCESSING])
            .values_list("project_id", flat=True)
            .distinct()
        )
        if not active:
            return False
        instances = dict(ComfyInstance.objects.filter(project_id__in=active).values_list("project_id", "id"))
        for project_id in active - set(instances):
            instances[project_id] = ComfyInstance.objects.get_or_create(project_id=project_id)[0].id
        scheduled = False
        mono = time.monotonic()
        for instance_id in instances.values():
            if instance_id in self._urgent or mono - self._last_check.get(instance_id, -1e9) >= CHECK_SECONDS:
                scheduled = self.schedule(instance_id) or scheduled
        return scheduled

    def schedule(self, instance_id: int) -> bool:
        with self._lock:
            if instance_id in self._busy:
                self._urgent.add(instance_id)
                return False
            self._busy.add(instance_id)
            self._urgent.discard(instance_id)
            self._last_check[instance_id] = time.monotonic()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=settings.POLL_PARALLELISM, thread_name_prefix="comfy-check")
        self._pool.submit(self._check_in_thread, instance_id)
        return True

    def _check_in_thread(self, instance_id: int) -> None:
        try:
            result = check_instance(instance_id)
            self._listen(instance_id, result)
        except Exception:
            log.exception("check of ComfyUI instance %s failed", instance_id)
        finally:
            connection.close()
            with self._lock:
                self._busy.discard(instance_id)
                again = instance_id in self._urgent
        if again:
            self.schedule(instance_id)

    def _listen(self, instance_id: int, result: dict) -> None:
        """Keep a WebSocket open to instances we drive with prompts in flight: a finished
        prompt is then checked at once instead of at the next 2 s check."""
        if not websocket_enabled():
            return
        from comfy_app import ws

        if self.listeners is None:
            self.listeners = ws.Listeners(on_event=self.schedule)
        if result.get("driving") and in_flight_count(ComfyInstance.objects.get(id=instance_id).project_id) > 0:
            instance = ComfyInstance.objects.get(id=instance_id)
            self.listeners.ensure(instance_id, instance.base_url, instance.client_id, client_for(instance))
        else:
            self.listeners.drop(instance_id)

    def shutdown(self) -> None:
        if self.listeners is not None:
            self.listeners.stop_all()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        owner = dispatch.worker_name()
        ComfyInstance.objects.filter(driver=owner).update(driver="", driver_until=None)


RUNNER = ComfyRunner()
