"""Probes as platforms define them: no authentication, no data.

- `/livez` — this process is alive and answers HTTP. It touches no dependency, so a
  database or Redis outage never makes a supervisor restart a healthy web process.
- `/readyz` — this process can serve: its database answers and, when REDIS_URL is set, its
  channel layer's Redis answers. A load balancer takes it out of rotation on 503. Stopped
  workers do not make a web process unready: the UI stays up mid-incident.
- `/fleetz` — the fleet, for humans and alerts: at least one queue service and one worker
  cluster have heartbeaten within three heartbeat periods (engine/heartbeats.py).
- `/healthz` — kept for existing configurations: the same checks as `/readyz`.

Each answers JSON `{"ok": bool, "checks": {name: "ok" | "down" | count}}` with 200 or 503.
The bodies name no host, pid, error text or user data: they are public.
"""

import logging

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from queue_app.engine import heartbeats

log = logging.getLogger(__name__)


def database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone()[0] == 1
    except Exception:
        log.warning("readyz: database unreachable", exc_info=True)
        return False


def redis_hosts() -> list[str]:
    """The Redis addresses this process serves through: its channel layer's hosts (a
    channels-redis layer) and REDIS_URL, which the broker and the layer are built from."""
    config = settings.CHANNEL_LAYERS.get("default", {}).get("CONFIG", {})
    hosts = [host for host in config.get("hosts", []) if isinstance(host, str)]
    if settings.REDIS_URL and settings.REDIS_URL not in hosts:
        hosts.append(settings.REDIS_URL)
    return hosts


def redis_ok(url: str | None = None) -> bool:
    """PING answered PONG by a Redis at `url` (a wrong port, password or a server that is
    not Redis all fail), within a second."""
    import redis

    try:
        client = redis.Redis.from_url(url or settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        try:
            return client.ping() is True
        finally:
            client.close()
    except Exception:
        log.warning("readyz: redis unreachable or wrong", exc_info=True)
        return False


def _answer(ok: bool, checks: dict) -> JsonResponse:
    return JsonResponse({"ok": ok, "checks": checks}, status=200 if ok else 503)


@never_cache
@require_GET
def livez(request):
    return _answer(True, {"process": "ok"})


def _ready_checks() -> dict:
    checks = {"database": "ok" if database_ok() else "down"}
    hosts = redis_hosts()
    if hosts:
        checks["redis"] = "ok" if all(redis_ok(url) for url in hosts) else "down"
    return checks


@never_cache
@require_GET
def readyz(request):
    checks = _ready_checks()
    return _answer(all(value == "ok" for value in checks.values()), checks)


healthz = readyz


@never_cache
@require_GET
def fleetz(request):
    if not database_ok():
        return _answer(False, {"database": "down"})
    live = heartbeats.liveness()
    checks = {"database": "ok", "queue_services": live["queue_services"], "workers": live["workers"]}
    return _answer(live["queue_services"] >= 1 and live["workers"] >= 1, checks)
