"""Claim (any process; database only): under the instance row lock, claim the oldest
pending jobs into the instance's free places — at most MAX_IN_FLIGHT prompts submitting or
at ComfyUI — and enqueue their submission to the workers. `take_claimed` is the other
end: the worker that picks a claimed job up."""

from django.db import close_old_connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from comfy_app.models import ComfyInstance, ComfyRun
from queue_app.engine import enqueue, transitions
from queue_app.engine.attempts import attempt_begin, attempt_collect
from queue_app.models import Job, JobAttempt, Kind, Status

MAX_IN_FLIGHT = 2

Phase = ComfyRun.Phase


def wants_video(job: Job, instance: ComfyInstance) -> bool:
    params = job.params or {}
    return bool(instance.include_video or params.get("video") or (job.format or "").lower() in ("mp4", "webm", "video"))


def instance_snapshot(job: Job, instance: ComfyInstance) -> dict:
    """The resolved snapshot a ComfyUI job is claimed with (the queue's is engine.snapshot)."""
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


def in_flight_count(project_id: int) -> int:
    """Prompts that count against the instance: processing jobs not yet finished at ComfyUI."""
    return (
        Job.objects.filter(project_id=project_id, status=Status.PROCESSING)
        .exclude(comfy_run__phase__in=[Phase.COLLECTING, Phase.DONE])
        .count()
    )


def claim_pending(project_id: int) -> list[tuple]:
    """Claim pending jobs into the instance's free places; enqueue their submission.
    Returns [(job_id, token)]. One short transaction, no network I/O."""
    instance = ComfyInstance.objects.filter(project_id=project_id).first()
    if instance is None:
        instance, _ = ComfyInstance.objects.get_or_create(project_id=project_id)
    if instance.unreachable_since is not None:
        return []  # known down: its jobs wait as pending until a check finds it answering
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
            .order_by(F("run_next_at").asc(nulls_last=True), "queued_at", "created_at", "id")[:free]
        )
        for job in candidates:
            snapshot = instance_snapshot(job, instance)
            token = transitions.job_claim_unslotted(job.id, project_id=project_id, snapshot=snapshot, owner="")
            if token is None:
                continue
            fields = dict(project_id=project_id, phase=Phase.SUBMITTING, missing_checks=0, remote_state="", finished_at=None)
            if not job.task_id:  # a retry that kept its prompt id keeps graph and nonce to find it again
                fields.update(nonce="", graph=None, posted_at=None)
            ComfyRun.objects.update_or_create(job_id=job.id, defaults=fields)
            enqueue.enqueue_task("comfy_app.tasks.submit_prompt", str(job.id), str(token))
            claimed.append((job.id, token))
    return claimed


def take_claimed(job_id, token, phase) -> tuple[Job, ComfyRun, JobAttempt, ComfyInstance] | None:
    """A worker picks up a job handed out in `phase` (submitting, collecting): the job, its
    run, the attempt it opens with the lease, and its instance. None when the hand-off is
    not ours any more (fenced out, taken twice, or the run moved on). A collection goes
    on with the attempt whose prompt it collects."""
    close_old_connections()
    job = Job.objects.select_related("project").fenced(job_id, token).first()
    run = ComfyRun.objects.filter(job_id=job_id).first()
    if job is None or run is None or run.phase != phase:
        return None
    attempt = attempt_collect(job, token) if phase == Phase.COLLECTING else attempt_begin(job, token)
    if attempt is None:
        return None
    return job, run, attempt, ComfyInstance.objects.get(project_id=job.project_id)
