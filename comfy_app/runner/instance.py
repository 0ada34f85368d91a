"""A ComfyUI instance as the runner sees it: its client, its driver lease (only the
queue service holding it checks the instance) and whether it answers."""

from datetime import timedelta

from django.db.models import Q
from django.db.models.functions import Now

from comfy_app import client as comfy
from comfy_app.models import ComfyInstance
from queue_app.engine import heartbeats

DRIVER_TTL = timedelta(seconds=20)


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
    ComfyInstance.objects.filter(id=instance_id, unreachable_since__isnull=True).update(unreachable_since=now)
    ComfyInstance.objects.filter(id=instance_id).update(last_error=reason[:2000])
