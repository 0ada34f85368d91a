"""A project's album as one zip, streamed: never the whole album in memory.

`zip_chunks` writes a zipfile into a sink that is not seekable, so the standard library
writes each entry's sizes and CRC in a data descriptor after its bytes instead of going
back to patch the header. Each file is copied in `CHUNK_BYTES` pieces and what the sink
holds is handed to the response after every piece: memory holds one chunk, not one file,
not the album. Media is stored as is (already compressed); text is deflated.

Under ASGI (daphne) Django would drain a sync iterator into a list before sending it —
the whole album in memory — so there the chunks are pulled one at a time through an
async iterator (`streamed`); under WSGI the plain generator streams as it is.
"""

import re
import zipfile
from collections.abc import AsyncIterator, Iterable, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest

from queue_app.engine.media import ALBUM_TYPES

CHUNK_BYTES = 256 * 1024


class _Sink:
    """A write-only, unseekable file object whose bytes are taken out as they come."""

    def __init__(self):
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


def entry_name(item) -> str:
    """`<job>-<prompt words>/<index>-<role>.<ext>`: each job's outputs and layers together."""
    words = re.sub(r"[^A-Za-z0-9]+", "-", item.prompt or "").strip("-")[:40].strip("-") or "output"
    folder = f"{str(item.job_id)[:8]}-{words}" if item.job_id else f"item-{item.id}-{words}"
    ext = "txt" if item.kind == "text" and not item.file else ALBUM_TYPES.get(item.content_type, "bin")
    return f"{folder}/{item.output_index:02d}-{item.role}-{item.id}.{ext}"


def zip_chunks(items: Iterable, *, chunk_bytes: int | None = None) -> Iterator[bytes]:
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", allowZip64=True) as archive:
        for item in items:
            name = entry_name(item)
            stamp = item.created_at.timetuple()[:6] if item.created_at else (1980, 1, 1, 0, 0, 0)
            if not item.file:
                info = zipfile.ZipInfo(name, date_time=stamp)
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, (item.text or "").encode())
                yield sink.take()
                continue
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_STORED
            try:
                source = item.file.open("rb")
            except FileNotFoundError:
                continue  # a file removed under us: the rest of the album still goes out
            with source, archive.open(info, "w", force_zip64=True) as target:
                while chunk := source.read(chunk_bytes):
                    target.write(chunk)
                    yield sink.take()
            yield sink.take()
    yield sink.take()


async def _one_at_a_time(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    # thread_sensitive: every step runs in the same thread, which holds the database
    # connection the items' query streams from.
    done = object()
    step = sync_to_async(lambda: next(chunks, done), thread_sensitive=True)
    while (chunk := await step()) is not done:
        yield chunk


def streamed(request, chunks: Iterator[bytes]):
    """What to give StreamingHttpResponse so that this server streams `chunks`."""
    return _one_at_a_time(iter(chunks)) if isinstance(request, ASGIRequest) else chunks
