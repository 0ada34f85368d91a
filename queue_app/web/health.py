"""Health checks for load balancers and supervisors: no authentication, no data.

- `/healthz` — this web process can reach its database and, when REDIS_URL is set, Redis.
  A load balancer takes a process out of rotation when this fails.
- `/readyz` — the queue can move work: at least one queue service and one worker cluster
  have heartbeaten within three heartbeat periods (engine/heartbeats.py). A supervisor or
  a deploy gate reads this; a web process alone is healthy but not ready.

Both answer JSON `{"ok": bool, "checks": {name: "ok" | "down" | count}}` with 200 or 503.
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
        log.warning("healthz: database unreachable", exc_info=True)
        return False


def redis_ok() -> bool:
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        log.warning("healthz: redis unreachable", exc_info=True)
        return False


def _answer(ok: bool, checks: dict) -> JsonResponse:
    return JsonResponse({"ok": ok, "checks": checks}, status=200 if ok else 503)


@never_cache
@require_GET
def healthz(request):
    checks = {"database": "ok" if database_ok() else "down"}
    if settings.REDIS_URL:
        checks["redis"] = "ok" if redis_ok() else "down"
    return _answer(all(value == "ok" for value in checks.values()), checks)


@never_cache
@require_GET
def readyz(request):
    if not database_ok():
        return _answer(False, {"database": "down"})
    live = heartbeats.liveness()
    checks = {"database": "ok", "queue_services": live["queue_services"], "workers": live["workers"]}
    return _answer(live["queue_services"] >= 1 and live["workers"] >= 1, checks)
