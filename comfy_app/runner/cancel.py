"""Stopping a prompt at ComfyUI when its job was cancelled: deleted from the queue while
it waits, interrupted while it runs (`POST /interrupt {"prompt_id"}` only stops that
prompt, so another job's running prompt is never hit). Both calls answer 200 and confirm
nothing (../shared/comfyui README), so this is best effort: errors are logged."""

import logging

from comfy_app import client as comfy
from comfy_app.models import ComfyInstance
from comfy_app.runner.instance import client_for

log = logging.getLogger(__name__)


def cancel_prompt(project_id: int, prompt_id: str) -> str:
    """Returns where the prompt was ("pending", "running") or "" when ComfyUI did not
    have it queued (finished, never posted, or unknown)."""
    instance = ComfyInstance.objects.filter(project_id=project_id).first()
    if instance is None or not instance.base_url or not prompt_id:
        return ""
    try:
        client = client_for(instance)
        where = client.queue().get(prompt_id, "")
        if where == "pending":
            client.delete_queued([prompt_id])
        elif where == "running":
            client.interrupt(prompt_id)
        return where
    except comfy.ComfyError as error:
        log.warning("cancelling ComfyUI prompt of project %s failed: %s", project_id, error.reason)
        return ""
