"""Live events: an outbox row per change, pushed to browsers after commit.

A state change writes its ProjectEvent row in the same transaction as the change, with
the project's next sequence number; after commit it is offered to the channel layer.
The layer is best effort (every layer is at-most-once); the rows are the truth, and a
client that reconnects asks for what it missed after its last sequence number. In the
embedded default the worker processes cannot reach daphne's in-memory layer, so daphne
relays new rows itself (web/live/relay.py).
"""

import asyncio
import atexit
import logging
import os
import queue
import threading
from collections import defaultdict
from contextlib import contextmanager

from django.db import connection, transaction

from queue_app.engine import model_sql
from queue_app.models import EventCounter, ProjectEvent

log = logging.getLogger(__name__)


_batch = threading.local()


@contextmanager
def batched():
    """Within this block (inside the transaction of a change), events are collected and
    written at its end, all projects at once and in project id order. A handover completes
    one job and claims the next in one transaction: writing the completion's event at
    once would lock the project's counter before the claim locks job rows, against the
    engine's lock order (provider, job rows, then projects). Nothing is written when the
    block raises: the transaction rolls back anyway."""
    if getattr(_batch, "items", None) is not None:
        yield
        return
    _batch.items = []
    try:
        yield
        items = _batch.items
    finally:
        _batch.items = None
    emit_grouped(items)


def group_name(project_id: int) -> str:
    return f"project.{project_id}"


def emit_many(project_id: int, items: list[tuple[str, object, str, dict]]) -> list[ProjectEvent]:
    """Record events (kind, job_id, status, payload) for one project. Call inside the
    transaction of the change. The sequence bump locks the project's counter row until commit, so
    numbers are gap-free and in commit order per project."""
    if not items:
        return []
    if getattr(_batch, "items", None) is not None:
        _batch.items += [(project_id, *item) for item in items]
        return []
    last = _bump(project_id, len(items))
    first = last - len(items) + 1
    rows = [
        ProjectEvent(
            project_id=project_id,
            seq=first + offset,
            kind=kind,
            job_id=job_id,
            status=status or "",
            payload=payload or {},
        )
        for offset, (kind, job_id, status, payload) in enumerate(items)
    ]
    ProjectEvent.objects.bulk_create(rows)
    transaction.on_commit(lambda: broadcast(rows))
    return rows


def _bump(project_id: int, n: int) -> int:
    # One upsert: creates the counter on a project's first event, and the row lock it
    # takes serialises concurrent emitters until commit (both databases).
    table = EventCounter._meta.db_table
    with model_sql.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (project_id, last) VALUES (%s, %s) "
            f"ON CONFLICT (project_id) DO UPDATE SET last = {table}.last + excluded.last RETURNING last",
            [project_id, n],
        )
        return cursor.fetchone()[0]


def last_seq(project_id: int) -> int:
    return EventCounter.objects.filter(project_id=project_id).values_list("last", flat=True).first() or 0


def emit(project_id: int, kind: str, job_id=None, status: str = "", payload: dict | None = None) -> None:
    emit_many(project_id, [(kind, job_id, status, payload or {})])


def emit_grouped(items: list[tuple[int, str, object, str, dict]]) -> list[ProjectEvent]:
    """Events over several projects, in three statements whatever their number (one
    counter upsert, one insert, one broadcast): a heal or claim of thousands of jobs writes
    its events per batch, not per job or project. The counters are taken in project id
    order, so two transactions that touch the same projects lock them in the same order
    (no deadlock)."""
    if getattr(_batch, "items", None) is not None:
        _batch.items += items
        return []
    by_project = defaultdict(list)
    for project_id, kind, job_id, status, payload in items:
        by_project[project_id].append((kind, job_id, status, payload))
    if not by_project:
        return []
    counts = {project_id: len(group) for project_id, group in by_project.items()}
    rows, offsets = [], []
    for project_id in sorted(by_project):
        for offset, (kind, job_id, status, payload) in enumerate(by_project[project_id]):
            rows.append(
                ProjectEvent(project_id=project_id, seq=0, kind=kind, job_id=job_id, status=status or "", payload=payload or {})
            )
            offsets.append(offset)
    if connection.vendor == "postgresql":
        # Counters and rows in one statement (a handover's last before its commit).
        _number(rows, offsets, counts, last=_bump_and_insert(counts, rows, offsets))
    else:
        _number(rows, offsets, counts, last=_bump_many(counts))
        model_sql.insert_many(rows)
    transaction.on_commit(lambda: broadcast(rows))
    return rows


def _number(rows: list[ProjectEvent], offsets: list[int], counts: dict[int, int], *, last: dict[int, int]) -> None:
    """Each row's seq: its project's new last, less the rows of the project after it."""
    for row, offset in zip(rows, offsets, strict=True):
        row.seq = last[row.project_id] - counts[row.project_id] + 1 + offset


def _bump_many(counts: dict[int, int]) -> dict[int, int]:
    """_bump for several projects in one upsert (rows in project id order): {project: last}."""
    table = EventCounter._meta.db_table
    project_ids = sorted(counts)
    values = ", ".join(["(%s, %s)"] * len(project_ids))
    params = [value for project_id in project_ids for value in (project_id, counts[project_id])]
    with model_sql.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (project_id, last) VALUES {values} "
            f"ON CONFLICT (project_id) DO UPDATE SET last = {table}.last + excluded.last RETURNING project_id, last",
            params,
        )
        return dict(cursor.fetchall())


def _bump_and_insert(counts: dict[int, int], rows: list[ProjectEvent], offsets: list[int]) -> dict[int, int]:
    """PostgreSQL: _bump_many and the insert of `rows` (in project id order, each at its
    `offset` within its project's) in one statement, a data-modifying WITH whose counter
    upsert the insert numbers its rows from. Returns {project: last}, as _bump_many."""
    counter, table = EventCounter._meta.db_table, ProjectEvent._meta.db_table
    quote = connection.ops.quote_name
    project_ids = sorted(counts)
    fields = [f for f in ProjectEvent._meta.concrete_fields if not f.primary_key]
    names = [quote(f.column) for f in fields]
    # `seq` carries how many of its project's rows come after it, until the counter says.
    picked = [f"c.last - v.{name}" if f.name == "seq" else f"v.{name}" for f, name in zip(fields, names, strict=True)]
    row = "(" + ", ".join(f"%s::{f.db_type(connection)}" for f in fields) + ")"
    params = [value for project_id in project_ids for value in (project_id, counts[project_id])]
    for event, offset in zip(rows, offsets, strict=True):
        event.seq = counts[event.project_id] - 1 - offset
        params += [f.get_db_prep_save(f.pre_save(event, add=True), connection) for f in fields]
    with model_sql.cursor() as cursor:
        cursor.execute(
            f"WITH c AS (INSERT INTO {counter} (project_id, last) VALUES {', '.join(['(%s, %s)'] * len(project_ids))} "
            f"ON CONFLICT (project_id) DO UPDATE SET last = {counter}.last + excluded.last RETURNING project_id, last) "
            f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(picked)} "
            f"FROM (VALUES {', '.join([row] * len(rows))}) AS v ({', '.join(names)}) "
            "JOIN c ON c.project_id = v.project_id RETURNING project_id, seq",
            params,
        )
        returned = cursor.fetchall()
    last = {}
    for project_id, seq in returned:
        last[project_id] = max(seq, last.get(project_id, seq))
    return last


def as_message(event: ProjectEvent) -> dict:
    return {
        "project": event.project_id,
        "seq": event.seq,
        "kind": event.kind,
        "job": str(event.job_id) if event.job_id else None,
        "status": event.status,
        "payload": event.payload,
    }


def broadcast(rows: list[ProjectEvent]) -> None:
    """Offer committed events to the channel layer. To Redis they go through this
    process's sender thread, so the committing worker does not wait for them; the
    in-memory layer (one process, the embedded default) is served at once."""
    try:
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        layer = get_channel_layer()
        if layer is None or not rows:
            return
        if isinstance(layer, InMemoryChannelLayer):
            from asgiref.sync import async_to_sync

            async_to_sync(_send_all)(layer, rows)
        else:
            _sender.put(layer, rows)
    except Exception:  # best effort: the outbox row is the truth
        log.warning("live event broadcast failed", exc_info=True)


def group_messages(rows: list[ProjectEvent]) -> list[tuple[str, dict]]:
    """Committed events as (group, message): one message per project, its events in the
    order given. A handover commits two events of one project (the completion and the
    next claim): one group send, not two — each costs the sender two Redis round trips
    before it reaches anybody."""
    by_project: dict[int, list[dict]] = {}
    for row in rows:
        by_project.setdefault(row.project_id, []).append(as_message(row))
    return [
        (group_name(project_id), {"type": "project.event", "event": found[0]})
        if len(found) == 1
        else (group_name(project_id), {"type": "project.events", "events": found})
        for project_id, found in by_project.items()
    ]


async def _send_all(layer, rows) -> None:
    for group, message in group_messages(rows):
        await layer.group_send(group, message)


class _Sender:
    """One daemon thread per process with one event loop (so one Redis connection),
    sending committed events in commit order. A send on the committing thread cost a
    worker two new Redis connections per job (about 3 ms each) between one provider call
    and the next. What a killed process never sent, the relay in daphne delivers from the
    rows (relay.py)."""

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        # Also in a forked child (django-q2 forks its workers): the parent's thread does
        # not exist there, and a lock the parent held at the fork would stay held.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue | None = None
        self._pending = 0

    def put(self, layer, rows) -> None:
        with self._lock:
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(self._queue,), name="live-event-sender", daemon=True).start()
            self._pending += 1
            self._queue.put((layer, list(rows)))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until what was put so far has been sent (tests; a stopping process)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    def _run(self, inbox: queue.SimpleQueue) -> None:
        loop = asyncio.new_event_loop()
        while True:
            batches = [inbox.get()]
            while len(batches) < 100:
                try:
                    batches.append(inbox.get_nowait())
                except queue.Empty:
                    break
            # What queued up meanwhile goes out together: one message per project.
            merged: list[tuple[object, list]] = []
            for layer, rows in batches:
                if merged and merged[-1][0] is layer:
                    merged[-1][1].extend(rows)
                else:
                    merged.append((layer, list(rows)))
            for layer, rows in merged:
                try:
                    loop.run_until_complete(_send_all(layer, rows))
                except Exception:
                    log.warning("live event broadcast failed", exc_info=True)
            with self._idle:
                self._pending -= len(batches)
                self._idle.notify_all()


_sender = _Sender()
os.register_at_fork(after_in_child=_sender._reset)
atexit.register(_sender.flush, 2.0)


def broadcast_progress(project_id: int, job_id, progress: float, detail: str = "") -> None:
    """Progress ticks go to open sockets only; they are not stored as events. `detail`
    says what is progressing (ComfyUI: the node running now)."""
    try:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is not None:
            message = {"project": project_id, "kind": "job.progress", "job": str(job_id), "progress": progress}
            if detail:
                message["detail"] = detail
            async_to_sync(layer.group_send)(group_name(project_id), {"type": "project.progress", "event": message})
    except Exception:
        log.debug("progress broadcast failed", exc_info=True)
