"""WebSocket listeners: a finished prompt is checked at once, not at the next 2 s check.

Only an accelerator. The runner's polling of /queue and /history is the truth; a socket
that drops, goes silent (ComfyUI's same-clientId quirk) or never connects costs only
latency. One event loop thread serves every listener of the process. Per the recordings:
our prompts carry the socket's clientId (events go only to that socket), the end of a
run is `executing {node: null, prompt_id}` (also after errors and interrupts), and a
reconnect closes the old socket before it opens the new one. The same socket carries step
`progress`, which goes onto the job (comfy_app/progress.py, at most once a second).
"""

import asyncio
import json
import logging
import threading
from urllib.parse import quote

from comfy_app import allowed_hosts, progress
from queue_app.providers import net

log = logging.getLogger(__name__)

RECONNECT_SECONDS = 3.0
DONE_TYPES = ("execution_success", "execution_error", "execution_interrupted")


def is_done(message: dict) -> bool:
    kind, data = message.get("type"), message.get("data") or {}
    if kind in DONE_TYPES:
        return True
    return kind == "executing" and data.get("node") is None and bool(data.get("prompt_id"))


class Listeners:
    def __init__(self, on_event, on_progress=None):
        self.on_event = on_event  # called with the instance id (from the loop thread)
        # called with (prompt_id, node, fraction) in a worker thread: it writes the database
        self.on_progress = on_progress
        self.throttle = progress.Throttle()
        self._tasks: dict[int, tuple[tuple, asyncio.Task]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="comfy-ws", daemon=True)
        self._thread.start()

    def ensure(self, instance_id: int, base_url: str, client_id: str, client) -> None:
        key = (base_url, client_id)
        current = self._tasks.get(instance_id)
        if current and current[0] == key and not current[1].done():
            return
        self.drop(instance_id)
        headers = client.download_headers()
        future = asyncio.run_coroutine_threadsafe(self._spawn(instance_id, client.base_url, client_id, headers), self._loop)
        self._tasks[instance_id] = (key, future.result(timeout=5))

    async def _spawn(self, instance_id, base_url, client_id, headers):
        return asyncio.ensure_future(self._listen(instance_id, base_url, client_id, headers))

    def drop(self, instance_id: int) -> None:
        current = self._tasks.pop(instance_id, None)
        if current:
            self._loop.call_soon_threadsafe(current[1].cancel)

    async def _progress(self, body: dict) -> None:
        """Step progress onto the job, throttled here (no I/O) and written off the loop."""
        if self.on_progress is None:
            return
        update = progress.parse(body)
        if update is not None:
            write = self.throttle.offer(*update)
        elif is_done(body):
            prompt_id = str((body.get("data") or {}).get("prompt_id") or "")
            last = self.throttle.final(prompt_id)
            write, update = last, (prompt_id,) if last else None
        else:
            return
        if write is not None:
            try:
                await asyncio.to_thread(self.on_progress, update[0], *write)
            except Exception:
                log.debug("progress of prompt %s not stored", update[0], exc_info=True)

    async def _listen(self, instance_id: int, base_url: str, client_id: str, headers: dict) -> None:
        import aiohttp

        url = base_url.replace("http", "ws", 1) + "/ws?clientId=" + quote(client_id)
        net.set_purpose(allowed_hosts.PURPOSE)  # this task's context only
        while True:
            try:
                timeout = aiohttp.ClientTimeout(total=None, connect=5, sock_read=None)
                # The same guard as every other outbound call: URL checked, no redirects,
                # the connected address checked before the upgrade is sent.
                async with net.ws_session(timeout=timeout) as session:
                    async with session.ws_connect(url, headers=headers, heartbeat=30, max_msg_size=64 * 1024 * 1024) as socket:
                        async for message in socket:
                            if message.type == aiohttp.WSMsgType.TEXT:
                                try:
                                    body = json.loads(message.data)
                                except (ValueError, RecursionError):  # the instance is a server its user chose
                                    continue
                                if not isinstance(body, dict):
                                    continue
                                await self._progress(body)
                                if is_done(body):
                                    self.on_event(instance_id)
                            elif message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                                break
                            # binary preview frames (event types 1 and 4) are of no use here
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.debug("ComfyUI socket of instance %s: %s", instance_id, error)
            await asyncio.sleep(RECONNECT_SECONDS)
