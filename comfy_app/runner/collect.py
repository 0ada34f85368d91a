"""Collect (a django-q2 worker): stream a finished prompt's outputs (idle and total
limits), then the queue's output writer completes the job."""

import logging
import os
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from comfy_app import client as comfy
from comfy_app.models import ComfyInstance, ComfyRun
from comfy_app.runner.instance import client_for
from queue_app.engine import enqueue, outputs, transitions
from queue_app.engine.attempts import attempt_begin, attempt_finish
from queue_app.engine.leases import LeaseKeeper
from queue_app.models import Job, JobAttempt
from queue_app.providers import net
from queue_app.providers.base import Output

log = logging.getLogger(__name__)

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


def retoken(job_id, old_token, *, hold: timedelta) -> uuid.UUID | None:
    """A fresh lease token for re-enqueued work: the old task, if it still runs, is fenced out."""
    token = uuid.uuid4()
    if Job.objects.fenced(job_id, old_token).update(lease_token=token, lease_owner="", lease_expires_at=Now() + hold):
        return token
    return None


def start_collect(job_id, token, prompt_id: str) -> bool:
    """The prompt is done at ComfyUI: it stops counting now, and a worker downloads."""
    with transaction.atomic():
        if not ComfyRun.objects.filter(job_id=job_id, phase__in=[Phase.SUBMITTING, Phase.REMOTE]).update(
            phase=Phase.COLLECTING, finished_at=timezone.now(), remote_state="finished"
        ):
            return False
        new_token = retoken(job_id, token, hold=COLLECT_CLAIM)
        if new_token is None:
            return False
        enqueue.enqueue_task("comfy_app.tasks.collect_job", str(job_id), str(new_token))
    return True


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


def collect_prompt(job_id, token) -> str:
    """Worker: download a finished prompt's outputs and complete the job."""
    close_old_connections()
    job = Job.objects.select_related("project").fenced(job_id, token).first()
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
