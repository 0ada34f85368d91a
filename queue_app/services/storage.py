"""Stored files: reference uploads, the per-user storage bound, album items and file removal."""

import hashlib
import logging

from django.conf import settings
from django.db import IntegrityError, transaction

from queue_app.engine import events, outputs
from queue_app.models import Job, Reference, Status
from queue_app.services import references
from queue_app.services.errors import ServiceError

log = logging.getLogger(__name__)


MIB = 1024 * 1024  # storage is shown in MB of 2^20 bytes, as JOB_STORAGE_ESTIMATE_BYTES counts them


def reference_store(user, data: bytes, *, label: str = "the file") -> str:
    """Keep an uploaded reference image once per content per user; its sha256. The type
    and size come from the bytes (references.image_facts), so a renamed HTML file or an
    SVG is refused with the reason."""
    from django.core.files.base import ContentFile

    try:
        content_type, width, height = references.image_facts(data, label=label)
    except references.BadReference as error:
        raise ServiceError(str(error)) from None
    sha = hashlib.sha256(data).hexdigest()
    if Reference.objects.filter(owner=user, sha256=sha).exists():
        return sha
    row = Reference(owner=user, sha256=sha, content_type=content_type, size=len(data), width=width, height=height)
    row.file.save(f"{sha}.{media_extension(content_type)}", ContentFile(data), save=False)
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError:
        # The same picture uploaded twice at once: the other request's row and file stand;
        # ours (saved under another name by the storage) goes.
        row.file.delete(save=False)
    return sha


def media_extension(content_type: str) -> str:
    from queue_app.engine.media import ALBUM_TYPES

    return ALBUM_TYPES.get(content_type, "bin")


def storage_check(*, user, starting: int) -> None:
    """Refuse when album usage plus 25 MB per pending job (all of the user's pending
    jobs, plus the ones about to start) would pass the user's storage limit."""
    if starting <= 0:
        return
    pending = Job.objects.filter(owner=user, status=Status.PENDING).count()
    needed = (pending + starting) * settings.JOB_STORAGE_ESTIMATE_BYTES
    used = outputs.usage_bytes(user.id)
    limit = outputs.storage_limit(user.id)
    if used + needed > limit:
        per_job = settings.JOB_STORAGE_ESTIMATE_BYTES
        fits = max(0, (limit - used - pending * per_job) // per_job)
        raise ServiceError(
            f"Storage limit exceeded: {fits} of these {starting} job(s) fit now. "
            f"The album uses {used / MIB:.1f} MB of {limit / MIB:.0f} MB, and every pending job reserves "
            f"{per_job / MIB:.0f} MB ({pending + starting} pending would need ~{needed / MIB:.0f} MB). "
            "Free space by deleting album items or projects, or ask an administrator to raise your limit "
            "(Admin → Account settings, per user).",
            403,
        )


def _delete_files(names, *, folder: str = "") -> None:
    """Files go after the commit: a rolled-back delete must not lose them."""
    import os

    from django.core.files.storage import default_storage

    for name in names:
        try:
            default_storage.delete(name)
        except OSError:
            log.warning("could not delete an album file of a deleted project")
    if folder:
        try:  # the project's album folder, when the storage is a local folder and it is empty
            os.rmdir(default_storage.path(folder))
        except (NotImplementedError, OSError):
            pass


def album_item_delete(*, user, item_id) -> int:
    """Delete one of the user's album items and its files; returns the bytes freed. The
    owner's storage usage is the sum of their items' sizes, so the row going frees them;
    the files go after the commit (a rollback keeps them with their row)."""
    from queue_app.engine.outputs import remove_files
    from queue_app.models import AlbumItem

    with transaction.atomic():
        item = AlbumItem.objects.select_for_update().filter(id=item_id, owner=user).first()
        if item is None:
            raise ServiceError("album item not found", 404)
        names = [name for name in (item.file.name, item.poster.name) if name]
        item.delete()
        events.emit(item.project_id, "album.deleted", item.job_id, "", {"item": item_id, "freed": item.size})
        transaction.on_commit(lambda: remove_files(names))
    return item.size
