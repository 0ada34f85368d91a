"""Reference uploads, once per content per instance, also when jobs start together.

Each reference goes up under its content-hash name. The check "does the instance have it?"
and the upload are one step for one process only: a `ComfyUpload` row (unique per
instance, address and name) is claimed first. Whoever creates it asks the instance and
uploads; the others wait for its `stored_as` (and check the file is still there). A claim whose holder died expires after
CLAIM_SECONDS and is taken over. No network call happens inside a transaction.
"""

import time
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Now

from comfy_app import client as comfy
from comfy_app.models import ComfyUpload
from queue_app.engine.clock import db_now

CLAIM_SECONDS = 330  # longer than an upload may take (client.UPLOAD_TIMEOUT)
WAIT_STEP = 0.1


def _claim(instance_id: int, address: str, name: str) -> tuple[ComfyUpload, bool]:
    """(row, mine): mine when this caller is the one to upload now."""
    # The database's clock: another host's process decides when this claim has run out.
    until = db_now() + timedelta(seconds=CLAIM_SECONDS)
    try:
        with transaction.atomic():
            row = ComfyUpload.objects.create(instance_id=instance_id, address=address, name=name, claimed_until=until)
        return row, True
    except IntegrityError:
        pass
    row = ComfyUpload.objects.get(instance_id=instance_id, address=address, name=name)
    if row.stored_as:
        return row, False
    # The holder died mid-upload (its claim ran out): take it over, one taker only.
    expired = Q(claimed_until__isnull=True) | Q(claimed_until__lt=Now())
    taken = ComfyUpload.objects.filter(id=row.id, stored_as="").filter(expired).update(claimed_until=until)
    return row, bool(taken)


def upload_once(client: comfy.ComfyClient, instance_id: int, data: bytes, name: str, content_type: str) -> str:
    """What LoadImage takes for this content: uploaded by exactly one caller."""
    deadline = time.monotonic() + CLAIM_SECONDS
    while True:
        row, mine = _claim(instance_id, client.base_url, name)
        if row.stored_as:
            if client.has_input(name):  # a 1-byte read: the input folder may have been wiped since
                return row.stored_as
            ComfyUpload.objects.filter(id=row.id, stored_as=row.stored_as).delete()
            continue
        if mine:
            break
        if time.monotonic() > deadline:
            raise comfy.CheckFailed(f"another upload of {name} to ComfyUI did not finish")
        time.sleep(WAIT_STEP)
    try:
        if client.has_input(name):
            stored = f"{comfy.UPLOAD_SUBFOLDER}/{name}"
        else:
            stored = client.upload(data, name, content_type=content_type)
    except BaseException:
        ComfyUpload.objects.filter(id=row.id, stored_as="").delete()  # the next caller tries again
        raise
    ComfyUpload.objects.filter(id=row.id).update(stored_as=stored, claimed_until=None)
    return stored
