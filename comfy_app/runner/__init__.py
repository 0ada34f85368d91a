"""The ComfyUI runner: each project's jobs on its own instance, two prompts in flight.

claim.py (any process, database only) claims pending jobs into the instance's free places;
submit.py (a worker) stores the prompt id it chose, then posts it; check.py (the queue
service, per instance under a driver lease) reads /queue and /history and hands finished
prompts to collect.py (a worker), whose download the queue's output writer completes. A
prompt's post and its download are phases of one attempt. `ComfyRunner` plugs them into
the runner registry and schedules the checks; a WebSocket per driven instance only makes
checks come sooner. Every job write is fenced by the lease token, every status change goes
through engine/transitions, and no network call happens inside a transaction.
"""

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from comfy_app.models import ComfyInstance, ComfyRun
from comfy_app.runner.check import check_instance
from comfy_app.runner.claim import claim_pending, in_flight_count
from comfy_app.runner.instance import client_for
from queue_app.engine import heartbeats
from queue_app.models import Job, Kind, Status

log = logging.getLogger(__name__)

CHECK_SECONDS = 2.0

Phase = ComfyRun.Phase


def websocket_enabled() -> bool:
    """The WebSocket accelerator (settings.COMFY_WEBSOCKET, on by default)."""
    return bool(settings.COMFY_WEBSOCKET)


class ComfyRunner:
    """Registered for kind "comfyui" in queue_app.engine.runner_registry (see comfy_app.apps)."""

    def __init__(self):
        self._pool = None
        self._lock = threading.Lock()
        self._busy: set[int] = set()
        self._urgent: set[int] = set()
        self._last_check: dict[int, float] = {}
        self.listeners = None  # comfy_app.ws.Listeners, started with the first check

    # queue_app.engine.runner_registry interface

    def wake(self, project_ids) -> None:
        for project_id in sorted(project_ids):
            try:
                claim_pending(project_id)
            except Exception:
                log.warning("ComfyUI claim for project %s failed; the runner's tick retries", project_id, exc_info=True)

    def recover(self) -> int:
        """Adopt in-flight work after a restart: submissions and downloads whose worker is
        gone are handed out again by the next check (their leases are expired now);
        prompts at ComfyUI are simply checked. Nothing is posted twice: a resumed
        submission looks its stored prompt id up first."""
        adopted = 0
        rows = Job.objects.filter(status=Status.PROCESSING, project__kind=Kind.COMFYUI).values_list(
            "id", "lease_owner", "lease_expires_at", "comfy_run__phase"
        )
        now = timezone.now()
        for job_id, lease_owner, lease_expires_at, phase in rows:
            adopted += 1
            # A claim nobody has taken yet waits in the broker, which hands it to a worker;
            # handing it out again too would post its prompt twice. Its lease's end is the net.
            waiting = not lease_owner and lease_expires_at is not None and lease_expires_at > now
            if (
                phase in (Phase.SUBMITTING, Phase.COLLECTING)
                and not waiting
                and (not lease_owner or heartbeats.owner_is_dead(lease_owner))
            ):
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

    def cancel(self, *, job_id, project_id: int, task_id: str) -> None:
        """A cancelled job's prompt: deleted from ComfyUI's queue, or interrupted."""
        from comfy_app.runner.cancel import cancel_prompt

        cancel_prompt(project_id, task_id)

    def health(self, project_ids, now=None) -> dict:
        from comfy_app.health import instance_health

        return instance_health(project_ids, now=now)

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
            self.listeners = ws.Listeners(on_event=self.schedule, on_progress=_store_progress)
        if result.get("driving") and in_flight_count(ComfyInstance.objects.get(id=instance_id).project_id) > 0:
            instance = ComfyInstance.objects.get(id=instance_id)
            self.listeners.ensure(instance_id, instance.base_url, instance.client_id, client_for(instance))
        else:
            self.listeners.drop(instance_id)


def _store_progress(prompt_id: str, node: str, fraction: float) -> None:
    from comfy_app.progress import persist

    try:
        persist(prompt_id, node, fraction)
    finally:
        connection.close()  # a thread of asyncio's default pool


RUNNER = ComfyRunner()
