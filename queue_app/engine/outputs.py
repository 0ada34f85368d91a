"""The output writer: every finished job's results become album items here.

1. fetch each output (bytes, a URL through the guarded HTTP client, or text) and write
   it under a temporary name, outside any transaction;
2. in one transaction fenced by the job's lease token: check the storage quota with the
   real sizes, rename the files into place, upsert one album item per (job, output index),
   drop items of indexes the new result lacks, and complete the job and its attempt.

A worker that lost the job matches no row at step 2 and writes nothing. A full media disk
(ENOSPC, EDQUOT) raises DiskFull with nothing half-written left behind: the caller lets
the job wait for space instead of failing it for good.
"""

import dataclasses
import errno
import hashlib
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from queue_app.engine import events, failpoints, hot_sql, media, model_sql, transitions
from queue_app.models import AccountSettings, AlbumItem, Job, Reference, fence
from queue_app.providers import net
from queue_app.providers.base import Output
from queue_app.sizes import human_bytes

log = logging.getLogger(__name__)


class QuotaExceeded(Exception):
    pass


class Fenced(Exception):
    """The job is no longer ours: write nothing."""


class DiskFull(Exception):
    """The media disk has no room for the results (nothing was kept)."""


FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


MEDIA_FULL_REASON = "waiting for space: the media disk is full, so nothing is sent to the provider until it has room"


def media_has_room() -> bool:
    """Room on the media disk for results (MEDIA_MIN_FREE_BYTES free): a job is not sent
    when its result could not be stored — a synchronous provider would be paid again."""
    try:
        return shutil.disk_usage(settings.MEDIA_ROOT).free >= settings.MEDIA_MIN_FREE_BYTES
    except FileNotFoundError:  # nothing written yet: the first write creates it
        return True


def _disk_full(error: OSError, size: int) -> DiskFull:
    return DiskFull(f"the media disk is full: no room to write the results ({size:,} bytes); waiting for space")


@dataclass
class Prepared:
    output: Output
    tmp_path: Path | None
    name: str  # storage name relative to MEDIA_ROOT
    size: int
    sha256: str
    content_type: str
    width: int | None
    height: int | None
    poster_tmp: Path | None = None
    poster_name: str = ""


def usage_bytes(user_id: int, *, excluding_job=None) -> int:
    """What a user stores: their album items (but the job `excluding_job`'s) and the
    reference images they uploaded."""
    items = AlbumItem.objects.filter(owner_id=user_id)
    if excluding_job is not None:
        items = items.exclude(job_id=excluding_job)
    return (items.aggregate(total=Sum("size"))["total"] or 0) + reference_bytes(user_id)


def reference_bytes(user_id: int) -> int:
    return Reference.objects.filter(owner_id=user_id).aggregate(total=Sum("size"))["total"] or 0


def storage_limit(user_id: int) -> int:
    row = AccountSettings.objects.filter(user_id=user_id).values_list("storage_limit_bytes", flat=True).first()
    return row if row is not None else settings.DEFAULT_STORAGE_LIMIT_BYTES


def _dimensions(data: bytes, content_type: str) -> tuple[int | None, int | None]:
    if not content_type.startswith("image/"):
        return None, None
    _, width, height = media.image_header(data)  # the header only: sniff already bounded its pixels
    return width, height


def _write_tmp(data: bytes) -> Path:
    tmp_dir = Path(settings.MEDIA_ROOT) / "tmp"
    path = tmp_dir / f"{uuid.uuid4().hex}.part"
    try:
        tmp_dir.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException as error:
        # The caller discards only the files it was handed: this one, half written, goes here.
        path.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in FULL_ERRNOS:
            raise _disk_full(error, len(data)) from error
        raise
    return path


def prepare(job: Job, index: int, output: Output) -> Prepared:
    """Fetch one output and write it under a temporary name. Its media type is read from
    its bytes (engine/media.py), never taken from the remote server: media.NotMedia for a
    file the album cannot show."""
    if output.kind == "text" and output.data is None and not output.url:
        text = output.text or ""
        encoded = text.encode()
        return Prepared(output, None, "", len(encoded), hashlib.sha256(encoded).hexdigest(), "text/plain", None, None)
    data = output.data
    if data is None:
        if not output.url:
            raise ValueError(f"output {index} has neither data nor a URL")
        data, _ = net.download(output.url, headers=output.headers)
    try:
        content_type = media.sniff(data, text_allowed=output.kind == "text")
    except media.NotMedia as error:
        raise media.NotMedia(f"output {index} is {error}") from None
    if content_type == "text/plain":  # a text output fetched from a URL: kept as text, like any other
        return prepare(job, index, dataclasses.replace(output, data=None, url=None, text=data.decode("utf-8")))
    width, height = output.width, output.height
    if width is None:
        width, height = _dimensions(data, content_type)
    prepared = Prepared(
        output=output,
        tmp_path=_write_tmp(data),
        name=f"album/{job.project_id}/{job.id}-{index}.{media.ALBUM_TYPES[content_type]}",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_type=content_type,
        width=width,
        height=height,
    )
    poster = media.jpeg_poster(output.poster or _fetch_poster(output) or b"")
    if poster:
        prepared.poster_tmp = _write_tmp(poster)
        prepared.poster_name = f"album/{job.project_id}/{job.id}-{index}.poster.jpg"
        prepared.size += len(poster)
    return prepared


POSTER_MAX_BYTES = 10 * 1024 * 1024


def _fetch_poster(output: Output) -> bytes | None:
    """A video's poster frame from the provider's thumbnail URL. Best effort: a poster
    that cannot be fetched leaves the video without one, never fails the job."""
    if not output.poster_url:
        return None
    try:
        data, _ = net.download(output.poster_url, headers=output.headers, max_bytes=POSTER_MAX_BYTES)
    except Exception as error:
        log.info("poster frame not fetched (%s)", type(error).__name__)
        return None
    return data or None


def _discard(prepared: list[Prepared]) -> None:
    for item in prepared:
        for path in (item.tmp_path, item.poster_tmp):
            if path is not None:
                path.unlink(missing_ok=True)


def write_and_complete(
    job_id, token, outputs: list[Output], *, attempt_id=None, handover=None, job: Job | None = None, cost=None
) -> int:
    """Store the outputs as album items and complete the job, fenced by `token`, and mark
    the attempt `attempt_id` completed in the same transaction (a kill right after the
    commit cannot leave it "running"). With a `handover` (dispatch.Handover), the provider's
    next job is claimed into the freed slot in that transaction too. `job`: the row the
    caller holds under this lease (its id, project and owner name the files), saving a read;
    the transaction checks the fence either way. `cost`: the provider's figure, settled.
    Returns the number of items written.
    Raises Fenced, QuotaExceeded, DiskFull or a download error."""
    if job is None:
        job = Job.objects.fenced(job_id, token).first()
    if job is None:
        raise Fenced(job_id)
    if not outputs:
        raise ValueError("the provider reported success but returned no output")
    prepared = []
    try:
        for index, output in enumerate(outputs):
            prepared.append(prepare(job, index, output))
        failpoints.hit("after_download_before_album")
        _commit(job, token, prepared, attempt_id, handover, cost)
    except BaseException:
        _discard(prepared)
        raise
    return len(prepared)


METADATA_KEYS = ("provider_name", "family", "model", "aspect_ratio", "quality", "resolution", "format", "duration", "sound")


def _commit(job: Job, token, prepared: list[Prepared], attempt_id, handover, cost=None) -> None:
    placed: list[Path] = []  # files moved to a name no item had: removed if the commit fails
    try:
        _commit_placing(job, token, prepared, attempt_id, placed, handover, cost)
    except BaseException as error:
        for path in placed:
            path.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in FULL_ERRNOS:
            raise _disk_full(error, sum(item.size for item in prepared)) from error
        raise


def _commit_placing(job: Job, token, prepared: list[Prepared], attempt_id, placed: list[Path], handover, cost) -> None:
    # Events are written last (events.batched): the handover's claim locks the provider
    # and job rows, which come before project rows in the engine's lock order.
    with transaction.atomic(), events.batched():
        # The row lock (PostgreSQL) or the write lock (SQLite) holds off a heal, clear or
        # retry until we commit: between this check and the commit the job stays ours.
        found = hot_sql.job_to_complete(fence(job.id, token))
        if found is None:
            raise Fenced(job.id)
        locked, used, limit, has_items = found
        _check_quota(prepared, used, limit)
        replaced_files = _upsert_items(locked, prepared, placed, has_items=has_items)
        failpoints.hit("after_album_before_complete")
        done = f"{len(prepared)} output(s)"
        if not transitions.job_complete(job.id, token, held=locked, attempt=attempt_id, reason=done, cost=cost):
            raise Fenced(job.id)
        if handover is not None:
            handover.claim(vacated_slot=locked.slot)
        transaction.on_commit(lambda: remove_files(replaced_files))


def _check_quota(prepared: list[Prepared], used: int, limit: int) -> None:
    """With the real sizes: the owner's other items (`used`) plus these must fit the limit."""
    new_bytes = sum(item.size for item in prepared)
    if used + new_bytes > limit:
        raise QuotaExceeded(
            f"storage limit reached: the results need {human_bytes(new_bytes)} and "
            f"{human_bytes(max(0, limit - used))} of {human_bytes(limit)} is left"
        )


def _upsert_items(job: Job, prepared: list[Prepared], placed: list[Path], *, has_items: bool) -> list[str]:
    """Rename the files into place and write one album item per output index; items of
    indexes the new result no longer has go. Returns the files no item names any more.
    `has_items`: whether the job has items already (most have none to read)."""
    existing = {item.output_index: item for item in model_sql.select(AlbumItem, job_id=job.id)} if has_items else {}
    replaced_files = []
    for index, item in enumerate(prepared):
        old = existing.get(index)
        _place_files(item, placed if old is None else [])
        if old is not None:
            for field in ("file", "poster"):
                old_name = getattr(old, field).name
                if old_name and old_name not in (item.name, item.poster_name):
                    replaced_files.append(old_name)
        fields = _item_fields(job, item)
        # We hold the job, so `existing` is current: update in place or insert, with
        # no select-then-write round trip per item.
        if old is not None:
            AlbumItem.objects.filter(pk=old.pk).update(**fields, updated_at=timezone.now())
        else:
            model_sql.insert(AlbumItem(job_id=job.id, output_index=index, **fields))
    # A retried job overwrites its outputs: layers the new result no longer has go.
    for index, old in existing.items():
        if index >= len(prepared):
            replaced_files.extend(name for name in (old.file.name, old.poster.name) if name)
            old.delete()
    return replaced_files


def _place_files(item: Prepared, placed: list[Path]) -> None:
    media_root = Path(settings.MEDIA_ROOT)
    if item.tmp_path is not None:
        (media_root / item.name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(item.tmp_path, media_root / item.name)
        placed.append(media_root / item.name)
        item.tmp_path = None
    if item.poster_tmp is not None:
        os.replace(item.poster_tmp, media_root / item.poster_name)
        placed.append(media_root / item.poster_name)
        item.poster_tmp = None


def _item_fields(job: Job, item: Prepared) -> dict:
    snap = job.resolved or {}
    return dict(
        project_id=job.project_id,
        owner_id=job.owner_id,
        role=item.output.role,
        # What the bytes are, not what the provider called them.
        kind=media.kind_of(item.content_type) if item.name else item.output.kind,
        file=item.name,
        poster=item.poster_name,
        text=item.output.text or "",
        content_type=item.content_type,
        size=item.size,
        sha256=item.sha256,
        width=item.width,
        height=item.height,
        prompt=job.prompt,
        metadata={key: snap.get(key) for key in METADATA_KEYS},
    )


def remove_files(names: list[str]) -> None:
    media = Path(settings.MEDIA_ROOT)
    for name in names:
        (media / name).unlink(missing_ok=True)
