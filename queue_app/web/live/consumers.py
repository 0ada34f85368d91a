"""The per-project live-event socket, /ws/projects/<id>/: only the owner (or staff) joins.

It sends each event once and in sequence order, so a client never misses or repeats
one: a broadcast it already sent is dropped, an event past a gap (or the relay's
`project.advance`) makes it read the missing rows from the database first. A client that
reconnects passes `?after=<last seq>` (or sends {"type": "resume", "after": n}) and gets
what it missed, or {"type": "resync"} when those rows are gone or too many.
"""

import json
import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from queue_app.engine import events
from queue_app.models import Project, ProjectEvent
from queue_app.selectors.visibility import visible_to
from queue_app.web.live import relay

log = logging.getLogger(__name__)

MAX_REPLAY = 500
REFUSED = 4403
MAX_FRAME_CHARS = 4096  # a client sends ping and resume frames only


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def can_subscribe(user, project_id: int) -> bool:
    if not user or not user.is_authenticated:
        return False
    return visible_to(user, Project).filter(id=project_id).exists()


def missed_events(project_id: int, after: int, upto: int) -> list[dict] | None:
    """Events after `after` up to `upto`, or None when they cannot all be replayed."""
    if upto - after > MAX_REPLAY:
        return None
    rows = list(ProjectEvent.objects.filter(project_id=project_id, seq__gt=after, seq__lte=upto).order_by("seq"))
    if len(rows) != upto - after:
        return None  # pruned (or not visible yet): the client must reload
    return [events.as_message(row) for row in rows]


class ProjectConsumer(AsyncJsonWebsocketConsumer):
    project_id: int | None = None

    async def connect(self):
        project_id = int(self.scope["url_route"]["kwargs"]["project_id"])
        user = self.scope.get("user")
        if not await database_sync_to_async(can_subscribe)(user, project_id):
            # Closing before accept refuses the handshake (HTTP 403): no group, no events.
            await self.close(code=REFUSED)
            return
        self.project_id = project_id
        self.group = events.group_name(project_id)
        # Join first, then read the counter: an event committed in between is both in
        # the replay and in the channel, and the sequence check drops the second copy.
        await self.channel_layer.group_add(self.group, self.channel_name)
        relay.subscribe(project_id)
        await self.accept()
        current = await database_sync_to_async(events.last_seq)(project_id)
        after = _int(parse_qs(self.scope.get("query_string", b"").decode()).get("after", [None])[0])
        self.last = current
        await self.send_json({"type": "hello", "project": project_id, "seq": current})
        if after is not None:
            await self._resume(after, current)

    async def disconnect(self, code):
        if self.project_id is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            relay.unsubscribe(self.project_id)
            self.project_id = None

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """A frame that is not a small JSON text (binary, garbage, NaN, deep nesting) is
        answered with an error message; it never closes the socket with 1011."""
        try:
            if text_data is None or len(text_data) > MAX_FRAME_CHARS:
                raise ValueError("not a text frame")
            content = json.loads(text_data, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            await self.send_json({"type": "error", "error": f"frames are JSON objects of at most {MAX_FRAME_CHARS} characters"})
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict):
            return
        if content.get("type") == "ping":
            await self.send_json({"type": "pong", "seq": self.last})
        elif content.get("type") == "resume":
            after = _int(content.get("after"))
            if after is not None:
                current = await database_sync_to_async(events.last_seq)(self.project_id)
                await self._resume(after, current)

    async def _resume(self, after: int, current: int) -> None:
        if after > current:
            await self.send_json({"type": "resync", "project": self.project_id, "seq": current})
            self.last = current
            return
        self.last = after
        await self._catch_up(current)

    async def _catch_up(self, upto: int) -> None:
        if upto <= self.last:
            return
        missed = await database_sync_to_async(missed_events)(self.project_id, self.last, upto)
        if missed is None:
            await self.send_json({"type": "resync", "project": self.project_id, "seq": upto})
        else:
            for event in missed:
                await self.send_json({"type": "event", **event})
        self.last = upto

    # --- group messages ---

    async def project_event(self, message):
        await self._deliver(message["event"])

    async def project_events(self, message):
        for event in message["events"]:
            await self._deliver(event)

    async def _deliver(self, event):
        seq = event.get("seq") or 0
        if seq <= self.last:
            return
        if seq == self.last + 1:
            await self.send_json({"type": "event", **event})
            self.last = seq
        else:
            await self._catch_up(seq)

    async def project_advance(self, message):
        await self._catch_up(int(message["seq"]))

    async def project_progress(self, message):
        await self.send_json({"type": "progress", **message["event"]})


def _int(value) -> int | None:
    try:
        return int(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None
