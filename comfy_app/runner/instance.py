"""A ComfyUI instance as the runner sees it: its client, its driver lease (only the
queue service holding it checks the instance) and whether it answers."""

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from comfy_app import client as comfy
from comfy_app.models import ComfyInstance
from queue_app.engine import events, heartbeats

log = logging.getLogger(__name__)

DRIVER_TTL = timedelta(seconds=20)
# An instance that does not answer for this long fails the prompts it holds (check.py).
UNREACHABLE_LIMIT = timedelta(minutes=10)


def client_for(instance: ComfyInstance) -> comfy.ComfyClient:
    return comfy.ComfyClient(instance.base_url, username=instance.username, password=instance.password)


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


def mark_unreachable(instance_id: int, reason: str, now) -> None:
    """Note when the instance stopped answering; the change is logged once at WARNING and
    is a project event, so an open project or job page shows it without a reload."""
    with transaction.atomic():
        flipped = ComfyInstance.objects.filter(id=instance_id, unreachable_since__isnull=True).update(unreachable_since=now)
        project_id = ComfyInstance.objects.filter(id=instance_id).values_list("project_id", flat=True).first()
        if flipped and project_id is not None:
            events.emit(project_id, "instance.unreachable", None, "", {"reason": reason[:200]})
    if flipped:
        log.warning(
            "ComfyUI instance of project %s unreachable since %s: %s; in-flight jobs fail at %s",
            project_id,
            now.isoformat(timespec="seconds"),
            reason,
            (now + UNREACHABLE_LIMIT).isoformat(timespec="seconds"),
        )
    ComfyInstance.objects.filter(id=instance_id).update(last_error=reason[:2000])


def mark_reachable(instance: ComfyInstance, now) -> None:
    """The instance answers: clear the outage, and tell open pages when there was one."""
    with transaction.atomic():
        back = ComfyInstance.objects.filter(id=instance.id, unreachable_since__isnull=False).update(back_at=now)
        ComfyInstance.objects.filter(id=instance.id).update(unreachable_since=None, last_error="", last_checked_at=now)
        if back:
            events.emit(instance.project_id, "instance.reachable", None, "", {})
