"""The live-event relay, run inside each daphne process.

Workers and the queue service broadcast their events on commit through the channel
layer. With Redis that reaches every daphne; in the embedded default the layer is
in-memory, so a worker process's broadcast reaches nobody. The event rows are the truth
(events.py), so daphne relays them itself: while this process has subscribers, one query
per tick reads the event counters of their projects, and a project whose counter moved
gets one `project.advance` message; each consumer then reads the rows it has not sent
yet (consumers.py). One small query per tick, not one per socket.

With Redis the relay still runs, more slowly: every layer drops messages when a
channel is full (a burst of hundreds of events), and the relay is what makes a socket
converge after such a drop.
"""

import asyncio
import logging
from collections import Counter

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from queue_app.engine import events
from queue_app.models import EventCounter

log = logging.getLogger(__name__)

_subscribers: Counter = Counter()
_cursor: dict[int, int] = {}
_task: asyncio.Task | None = None


def interval() -> float:
    """Seconds between relay ticks; 0 turns the background relay off (tests drive it)."""
    return float(settings.LIVE_RELAY_SECONDS)


def subscribe(project_id: int) -> None:
    _subscribers[project_id] += 1
    _ensure_running()


def unsubscribe(project_id: int) -> None:
    _subscribers[project_id] -= 1
    if _subscribers[project_id] <= 0:
        del _subscribers[project_id]
        _cursor.pop(project_id, None)


def _ensure_running() -> None:
    global _task
    every = interval()
    if every <= 0:
        return
    loop = asyncio.get_running_loop()
    if _task is not None and not _task.done() and _task.get_loop() is loop:
        return
    _task = loop.create_task(_run(every), name="live-event-relay")


async def _run(every: float) -> None:
    while True:
        try:
            await relay_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            # The database may be busy or restarting; the next tick tries again.
            log.warning("live event relay tick failed", exc_info=True)
        await asyncio.sleep(every)


def _counters(project_ids: list[int]) -> list[tuple[int, int]]:
    return list(EventCounter.objects.filter(project_id__in=project_ids).values_list("project_id", "last"))


async def relay_once() -> int:
    """One tick: tell each subscribed project whose counter moved. Returns how many."""
    projects = list(_subscribers)
    if not projects:
        return 0
    rows = await database_sync_to_async(_counters)(projects)
    layer = get_channel_layer()
    advanced = 0
    for project_id, last in rows:
        if _cursor.get(project_id) == last or project_id not in _subscribers:
            continue
        _cursor[project_id] = last
        await layer.group_send(events.group_name(project_id), {"type": "project.advance", "seq": last})
        advanced += 1
    return advanced


def reset() -> None:
    """Forget subscribers and stop the task (tests)."""
    global _task
    if _task is not None:
        _task.cancel()
        _task = None
    _subscribers.clear()
    _cursor.clear()
