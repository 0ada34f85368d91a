"""The live-event relay, run inside each daphne process.

In the embedded default the channel layer is in-memory, so a worker's or the queue
service's broadcast reaches nobody. The event rows are the truth (events.py), so daphne
relays them: while it has subscribers, one query per tick reads their projects' event
counters, and a project whose counter moved gets one `project.advance` message (each
consumer then reads the rows it has not sent). Progress is not an event, but the job row
keeps the latest fraction (a ComfyUI node's steps, a detached task's progress): the same
tick sends each processing job's fraction that moved as a `project.progress` message.

With Redis the relay still runs, more slowly: a full channel drops messages (a burst of
hundreds of events), and the relay is what makes a socket converge after such a drop.
"""

import asyncio
import logging
from collections import Counter

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from queue_app.engine import events
from queue_app.models import EventCounter, Job, Status

log = logging.getLogger(__name__)

_subscribers: Counter = Counter()
_cursor: dict[int, int] = {}
_progress: dict[str, float] = {}  # job id: the fraction last relayed
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
        if not _subscribers:
            _progress.clear()


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


def _fractions(project_ids: list[int]) -> list[tuple[int, object, float]]:
    running = Job.objects.filter(project_id__in=project_ids, status=Status.PROCESSING, progress__isnull=False)
    return list(running.values_list("project_id", "id", "progress")[:2000])


async def relay_once() -> int:
    """One tick: tell each subscribed project whose counter moved, and each job whose
    progress moved. Returns how many messages went out."""
    projects = list(_subscribers)
    if not projects:
        return 0
    rows, fractions = await database_sync_to_async(lambda: (_counters(projects), _fractions(projects)))()
    layer = get_channel_layer()
    advanced = 0
    for project_id, last in rows:
        if _cursor.get(project_id) == last or project_id not in _subscribers:
            continue
        _cursor[project_id] = last
        await layer.group_send(events.group_name(project_id), {"type": "project.advance", "seq": last})
        advanced += 1
    for project_id, job_id, fraction in fractions:
        if _progress.get(str(job_id)) == fraction or project_id not in _subscribers:
            continue
        _progress[str(job_id)] = fraction
        message = {"project": project_id, "kind": "job.progress", "job": str(job_id), "progress": fraction}
        await layer.group_send(events.group_name(project_id), {"type": "project.progress", "event": message})
        advanced += 1
    if len(_progress) > 10 * max(len(fractions), 100):
        _progress.clear()  # finished jobs' entries: cleared now and then, a resend is harmless
    return advanced


def reset() -> None:
    """Forget subscribers and stop the task (tests)."""
    global _task
    if _task is not None:
        _task.cancel()
        _task = None
    _subscribers.clear()
    _cursor.clear()
    _progress.clear()
