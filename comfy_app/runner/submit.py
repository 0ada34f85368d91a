"""Submit (a django-q2 worker): build the graph (bindings, uploads by content hash,
re-rolled seeds), store the prompt id we chose *before* posting it, then POST /prompt.
A submission that dies is resolved later from ComfyUI's own /queue and /history (the
stored id is looked up before anything is posted again)."""

import logging
import uuid
from enum import StrEnum

from django.db import DatabaseError, transaction
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from comfy_app import client as comfy
from comfy_app import workflow
from comfy_app.models import ComfyInstance, ComfyRun
from comfy_app.runner.check import Where, locate
from comfy_app.runner.claim import take_claimed
from comfy_app.runner.collect import start_collect
from comfy_app.runner.instance import client_for, mark_unreachable
from comfy_app.runner.uploads import upload_once
from queue_app.engine import transitions
from queue_app.engine.attempts import Outcome
from queue_app.engine.leases import LeaseKeeper, leave_to_healing
from queue_app.models import ErrorClass, Job

log = logging.getLogger(__name__)

Phase = ComfyRun.Phase


class Submission(StrEnum):
    """What one submission did (for tests and logs; the first three are attempt reasons)."""

    POSTED = "posted"
    ADOPTED = "adopted"  # the stored prompt id is queued or running at ComfyUI already
    COLLECT = "collect"  # the stored prompt id finished already: handed to a collector
    SKIPPED = "skipped"  # the hand-off was not ours any more
    FENCED = "fenced"  # the job was taken before the prompt id was stored
    UNREACHABLE = "unreachable"  # left to the instance's next check
    AMBIGUOUS = "ambiguous"  # maybe accepted: the stored id is looked up before a new post
    REJECTED = "rejected"  # ComfyUI refused the prompt, or the setup is incomplete: failed
    ERROR = "error"


def submit_prompt(job_id, token) -> Submission:
    """Worker: submit one claimed job."""
    taken = take_claimed(job_id, token, Phase.SUBMITTING)
    if taken is None:
        return Submission.SKIPPED
    job, run, attempt, instance = taken
    try:
        with LeaseKeeper(job.id, token):
            result = _submit(job, token, run, instance)
    except comfy.Unreachable as error:
        mark_unreachable(instance.id, error.reason, timezone.now())
        # The job stays in flight; the instance's next check resolves it from ComfyUI's own records.
        transitions.job_given_back(
            job.id, token, attempt=attempt.id, outcome=Outcome.TRANSIENT, reason=error.reason, count_failure=False
        )
        return Submission.UNREACHABLE
    except comfy.CheckFailed as error:
        # Possibly accepted (a dropped connection after the body was sent): the stored
        # prompt id is looked up before anything is posted again.
        transitions.job_given_back(job.id, token, attempt=attempt.id, outcome=Outcome.AMBIGUOUS, reason=error.reason)
        return Submission.AMBIGUOUS
    except (comfy.ComfyError, workflow.WorkflowError) as error:
        reason = error.reason if isinstance(error, comfy.ComfyError) else str(error)
        transitions.job_fail(
            job.id, token, reason=reason, error_class=ErrorClass.PERMANENT, attempt=attempt.id, keep_task_id=False
        )
        return Submission.REJECTED
    except DatabaseError:
        leave_to_healing(job.id, "submitting")
        return Submission.ERROR
    except Exception as error:  # a bug or an unexpected answer: this job fails, the rest run
        log.exception("job %s: unexpected error while submitting to ComfyUI", job.id)
        reason = f"internal error while submitting to ComfyUI: {type(error).__name__}"
        transitions.job_fail(job.id, token, reason=reason, error_class=ErrorClass.LOCAL, attempt=attempt.id, keep_task_id=False)
        return Submission.ERROR
    if result not in (Submission.FENCED, Submission.COLLECT) and not Job.objects.fenced(job.id, token).exists():
        # Cancelled while the prompt was being posted: nobody will collect it, so stop it.
        from comfy_app.runner.cancel import cancel_prompt

        cancel_prompt(job.project_id, Job.objects.filter(id=job.id).values_list("task_id", flat=True).first() or "")
    return _submitted(job.id, token, attempt.id, result)


def _submitted(job_id, token, attempt_id, result: Submission) -> Submission:
    """The attempt's remote phase begins: a prompt at ComfyUI is the instance's checks'
    from now on, or (found finished already) a collector's."""
    if result is Submission.FENCED:
        transitions.job_lost(attempt_id, reason="job taken before the prompt was stored")
        return result
    prompt_id = Job.objects.filter(id=job_id).values_list("task_id", flat=True).first() or ""
    collect = result is Submission.COLLECT
    transitions.job_posted(job_id, token, attempt=attempt_id, task_id=prompt_id, reason=result, release_lease=not collect)
    if collect:
        start_collect(job_id, token, prompt_id)
    return result


def _submit(job: Job, token, run: ComfyRun, instance: ComfyInstance) -> Submission:
    if not instance.base_url:
        raise comfy.BadAddress("no ComfyUI address is set: add it in the project's ComfyUI settings")
    client = client_for(instance)
    if job.task_id and run.nonce:
        # A retry or a resumed submission: the prompt id was stored before it was posted.
        where, _ = locate(client, job.task_id, run.nonce)
        if where in (Where.PENDING, Where.RUNNING):
            # The post that queued it may never have been recorded (its worker died after
            # POST /prompt): restart detection needs the post's time and number, so a run
            # without them takes now (it was posted no later) and ComfyUI's own number.
            fields = dict(phase=Phase.REMOTE, remote_state=where, posted_at=Coalesce("posted_at", Value(timezone.now())))
            number = client.queued_number(job.task_id)
            if number is not None:
                fields["remote_number"] = number
            ComfyRun.objects.filter(job_id=job.id, phase=Phase.SUBMITTING).update(**fields)
            return Submission.ADOPTED
        if where is Where.SUCCESS:
            return Submission.COLLECT
        if where is Where.MISSING and run.graph:
            return _post(client, job, run.graph, job.task_id, run.nonce, instance)
        # failed at ComfyUI, or no graph kept: generate anew below
    validate_setup(instance)
    graph, seeds = workflow.build(instance.workflow, instance.bindings, job, upload=uploader(client, instance.id))
    prompt_id, nonce = str(uuid.uuid4()), uuid.uuid4().hex
    with transaction.atomic():
        if not transitions.job_attach_task(job.id, token, task_id=prompt_id):
            return Submission.FENCED
        order = [node for node in instance.node_order if node in graph] + [n for n in graph if n not in instance.node_order]
        ComfyRun.objects.filter(job_id=job.id).update(graph=graph, nonce=nonce, output_order=order, missing_checks=0)
        if seeds:
            params = dict(job.params or {})
            params["seeds"] = seeds
            Job.objects.fenced(job.id, token).update(params=params)
    return _post(client, job, graph, prompt_id, nonce, instance)


def validate_setup(instance: ComfyInstance) -> None:
    if not instance.workflow:
        raise workflow.WorkflowError("no workflow is set: paste an API-format workflow in the project's ComfyUI settings")
    workflow.validate_workflow(instance.workflow)


def _post(client, job: Job, graph: dict, prompt_id: str, nonce: str, instance: ComfyInstance) -> Submission:
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
        phase=Phase.REMOTE,
        posted_at=timezone.now(),
        remote_state="pending",
        warnings=warnings,
        remote_number=answer.get("number") if isinstance(answer.get("number"), int | float) else None,
    )
    return Submission.POSTED


def uploader(client: comfy.ComfyClient, instance_id: int):
    """Upload references under content-hash names; a file the instance holds is not sent
    again, and one content is uploaded once also when jobs start together (uploads.py)."""

    def upload(data: bytes, name: str, content_type: str) -> str:
        return upload_once(client, instance_id, data, name, content_type)

    return upload
