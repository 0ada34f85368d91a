"""Stored files: reference uploads, the per-user storage bound, album items and file removal."""

import hashlib
import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from queue_app import limits
from queue_app.engine import events, outputs
from queue_app.models import Job, Reference, Status
from queue_app.services import references
from queue_app.services.errors import ServiceError
from queue_app.sizes import human_bytes

log = logging.getLogger(__name__)


def reference_store(user, source, *, label: str = "the file") -> str:
    """Keep one uploaded reference image (`source`: bytes or an uploaded file) once per
    content per user, within the storage limit; its sha256. The type and size come from
    the bytes (references.checked), so a renamed HTML file or an SVG is refused with the
    reason."""
    try:
        new = references.checked(source, label=label)
    except references.BadReference as error:
        raise ServiceError(str(error)) from None
    return references_store_new(user, [new])[0][4:]


def reference_upload(*, user, upload, label: str) -> tuple[Reference, bool]:
    """POST /api/references: one image file stored (or found: stored once per content);
    (its row, whether it is new)."""
    try:
        new = references.checked(upload, label=label)
    except references.BadReference as error:
        raise ServiceError(str(error)) from None
    new.sha256 = _sha256(upload)
    known = Reference.objects.filter(owner=user, sha256=new.sha256).exists()
    references_store_new(user, [new])
    return Reference.objects.get(owner=user, sha256=new.sha256), not known


def references_store_new(user, items: list) -> list[str]:
    """`items` (references.normalize's) with each `New` image stored and named
    "ref:<sha256>". The new bytes count against the user's storage limit like album items
    (checked first: over it, nothing is stored); an image the user already stored is named
    again, not stored twice. Called once a draft is valid, so a refused one stores nothing."""
    from queue_app.services.references import New

    for item in items:
        if isinstance(item, New) and not item.sha256:
            item.sha256 = _sha256(item.source)
    shas = {id(item): item.sha256 for item in items if isinstance(item, New)}
    if not shas:
        return items
    known = set(Reference.objects.filter(owner=user, sha256__in=set(shas.values())).values_list("sha256", flat=True))
    fresh = {shas[id(item)]: item for item in items if isinstance(item, New) and shas[id(item)] not in known}
    quota_check(user=user, adding=sum(item.size for item in fresh.values()))
    for sha, item in fresh.items():
        _store_one(user, sha, item)
    if known:
        Reference.objects.filter(owner=user, sha256__in=known).update(last_used_at=timezone.now())
    return [f"ref:{shas[id(item)]}" if isinstance(item, New) else item for item in items]


def _sha256(source) -> str:
    if isinstance(source, bytes | bytearray):
        return hashlib.sha256(source).hexdigest()
    digest = hashlib.sha256()
    source.seek(0)
    for chunk in iter(lambda: source.read(1024 * 1024), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _store_one(user, sha: str, item) -> None:
    """One new Reference row and its file, copied in chunks from the upload."""
    from django.core.files.base import ContentFile, File

    content = ContentFile(item.source) if isinstance(item.source, bytes | bytearray) else File(item.source)
    content.seek(0)
    row = Reference(owner=user, sha256=sha, content_type=item.content_type, size=item.size, width=item.width, height=item.height)
    row.file.save(f"{sha}.{media_extension(item.content_type)}", content, save=False)
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError:
        # The same picture uploaded twice at once: the other request's row and file stand;
        # ours (saved under another name by the storage) goes.
        row.file.delete(save=False)


def quota_check(*, user, adding: int) -> None:
    """Refuse (403) new bytes that would take the user's stored files past their limit."""
    if adding <= 0:
        return
    used, limit = outputs.usage_bytes(user.id), outputs.storage_limit(user.id)
    if used + adding > limit:
        raise ServiceError(
            f"Storage limit exceeded: these reference images need {human_bytes(adding)} and "
            f"{human_bytes(max(0, limit - used))} of {human_bytes(limit)} is left. Free space by deleting album "
            "items or projects, or ask an administrator to raise your limit.",
            403,
            reason="storage_full",
        )


def references_prune(*, now=None, batch: int = 50) -> int:
    """Delete up to `batch` uploaded references that no job names and nobody used for
    limits.REFERENCE_GRACE_SECONDS (the queue service's step; small batches, oldest first).
    One still named is marked used now and looked at again a grace period later. The
    delete is conditional on the row still being unused, so a draft that names it at the
    same moment (references.normalize marks it used first) keeps it. Returns how many went."""
    from django.db.models import TextField
    from django.db.models.functions import Cast

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=limits.REFERENCE_GRACE_SECONDS)
    deleted = 0
    for row in Reference.objects.filter(last_used_at__lt=cutoff).order_by("last_used_at", "id")[:batch]:
        jobs = Job.objects.filter(owner_id=row.owner_id).exclude(references=[])
        if jobs.annotate(named=Cast("references", TextField())).filter(named__contains=f"ref:{row.sha256}").exists():
            Reference.objects.filter(id=row.id).update(last_used_at=now)
            continue
        with transaction.atomic():
            if Reference.objects.filter(id=row.id, last_used_at__lt=cutoff).delete()[0]:
                deleted += 1
                name = row.file.name
                transaction.on_commit(lambda name=name: _delete_files([name]))
    if deleted:
        log.info("removed %d reference image(s) no draft named", deleted)
    return deleted


def media_extension(content_type: str) -> str:
    from queue_app.engine.media import ALBUM_TYPES

    return ALBUM_TYPES.get(content_type, "bin")


def storage_check(*, user, starting: int) -> None:
    """Refuse when stored files (album items, uploaded references) plus 25 MB per pending
    job (all of the user's pending jobs, plus the ones about to start) would pass the
    user's storage limit."""
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
            f"The album uses {human_bytes(used)} of {human_bytes(limit)} (reference images included), "
            "and every pending job reserves "
            f"{human_bytes(per_job)} ({pending + starting} pending would need ~{human_bytes(needed)}). "
            "Free space by deleting album items or projects, or ask an administrator to raise your limit "
            "(Admin → Account settings, per user).",
            403,
            reason="storage_full",
        )


def _delete_files(names, *, folder: str = "") -> None:
    """Files go after the commit: a rolled-back delete must not lose them."""
    import os

    from django.core.files.storage import default_storage

    for name in names:
        try:
            default_storage.delete(name)
        except OSError:
            log.warning("could not delete a stored file (album item or reference image)")
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
            raise ServiceError("album item not found", 404, field="item_id")
        names = [name for name in (item.file.name, item.poster.name) if name]
        item.delete()
        events.emit(item.project_id, "album.deleted", item.job_id, "", {"item": item_id, "freed": item.size})
        transaction.on_commit(lambda: remove_files(names))
    return item.size
