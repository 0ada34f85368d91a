"""Collect (a django-q2 worker): stream a finished prompt's outputs (idle and total
limits), then the queue's output writer completes the job. `start_collect` is the
hand-over from a check (or a submission that found the prompt done already)."""

import logging
import os
import tempfile
import time
from datetime import timedelta
from enum import StrEnum
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from comfy_app import allowed_hosts
from comfy_app import client as comfy
from comfy_app.models import ComfyRun
from comfy_app.runner.claim import take_claimed
from comfy_app.runner.instance import client_for
from queue_app.engine import enqueue, transitions
from queue_app.engine.leases import LeaseKeeper, leave_to_healing
from queue_app.engine.results import Applied, store_outputs
from queue_app.models import ErrorClass, Job
from queue_app.providers import net
from queue_app.providers.base import Output

log = logging.getLogger(__name__)

COLLECT_CLAIM = timedelta(seconds=60)
VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv", ".avi")
AUDIO_EXTENSIONS = (".wav", ".mp3", ".flac", ".ogg", ".m4a")
KEEP = "The prompt id is kept: retry the job to download the finished result again."

Phase = ComfyRun.Phase


class Collected(StrEnum):
    """What one collection did (for tests and logs)."""

    COMPLETED = "completed"
    SKIPPED = "skipped"  # the hand-off was not ours any more
    FENCED = "fenced"  # the job was taken before its outputs were written
    NO_OUTPUT = "no-output"  # the workflow saved nothing: failed
    GONE = "gone"  # an output file is no longer on the instance: failed, prompt id dropped
    FAILED = "failed"  # a download or the storing failed: failed, prompt id kept
    ERROR = "error"  # a database error: the lease lapses and the next check hands it out again


def download_limits() -> tuple[float, float]:
    """(idle, total) seconds: abandoned only when no data arrives for a minute, or past 30 minutes."""
    return (
        float(settings.COMFY_DOWNLOAD_IDLE_SECONDS),
        float(settings.COMFY_DOWNLOAD_TOTAL_SECONDS),
    )


def hand_out_collection(job_id, token, *, if_over: bool = False) -> bool:
    """Enqueue a download under a fresh lease token (the old one, if a worker still holds
    it, is fenced out). False when the job is no longer ours under `token`, or, with
    `if_over`, when its lease has not ended (lease_reissue)."""
    new_token = transitions.job_hand_out_again(job_id, token, hold=COLLECT_CLAIM, if_over=if_over)
    if new_token is None:
        return False
    enqueue.enqueue_task("comfy_app.tasks.collect_prompt", str(job_id), str(new_token))
    return True


def start_collect(job_id, token, prompt_id: str) -> bool:
    """The prompt is done at ComfyUI: it stops counting now, and a worker downloads."""
    with transaction.atomic():
        if not ComfyRun.objects.filter(job_id=job_id, phase__in=[Phase.SUBMITTING, Phase.REMOTE]).update(
            phase=Phase.COLLECTING, finished_at=timezone.now(), remote_state="finished"
        ):
            return False
        return hand_out_collection(job_id, token)


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
            with net.purpose(allowed_hosts.PURPOSE):
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


def collect_prompt(job_id, token) -> Collected:
    """Worker: download a finished prompt's outputs and complete the job."""
    taken = take_claimed(job_id, token, Phase.COLLECTING)
    if taken is None:
        return Collected.SKIPPED
    job, run, attempt, instance = taken
    try:
        with LeaseKeeper(job.id, token):
            results = _fetch(client_for(instance), job, run)
            if not results:
                reason = "ComfyUI finished the prompt but the workflow saved no output files (add a SaveImage node)"
                transitions.job_fail(
                    job.id, token, reason=reason, error_class=ErrorClass.PERMANENT, attempt=attempt.id, keep_task_id=False
                )
                return Collected.NO_OUTPUT
            stored = store_outputs(job.id, token, attempt.id, results, source="ComfyUI", retry_hint=KEEP)
    except OutputGone as error:
        reason = f"the output file {error} is no longer on the ComfyUI instance; retry the job to generate it again"
        transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.LOCAL, attempt=attempt.id, keep_task_id=False)
        return Collected.GONE
    except DatabaseError:
        leave_to_healing(job.id, "collecting")
        return Collected.ERROR
    except Exception as error:
        detail = error.reason if isinstance(error, comfy.ComfyError) else str(error) or type(error).__name__
        reason = f"downloading the result from ComfyUI failed: {detail}. {KEEP}"
        log.warning("job %s: %s", job.id, reason)
        transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.LOCAL, attempt=attempt.id)
        return Collected.FAILED
    if stored is Applied.COMPLETED:
        ComfyRun.objects.filter(job_id=job.id).update(phase=Phase.DONE)
        return Collected.COMPLETED
    return Collected.FENCED if stored is Applied.SKIPPED else Collected.FAILED


def _fetch(client: comfy.ComfyClient, job: Job, run: ComfyRun) -> list[Output]:
    """The finished prompt's output files, downloaded; [] when the workflow saved none."""
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
    results = []
    for kind, item in files:
        data, content_type = _download(client, item)
        results.append(Output(kind=kind, data=data, content_type=content_type or ""))
    return results
