"""Liveness of our processes, from the database alone.

Worker clusters (qcluster) and queue services write a heartbeat row every
HEARTBEAT_SECONDS. The monitor warns when dispatchable work has nobody alive to take
it, and the recovery scan treats a lease whose owner process is known dead on this host
as gone without waiting for it to expire.
"""

import os
import socket
import threading
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from queue_app.models import Heartbeat


def process_name() -> str:
    """This process as a lease owner, attempt worker or instance driver: `host:pid`, which
    `owner_is_dead` reads back."""
    return f"{socket.gethostname()}:{os.getpid()}"


def beat(role: str, *, name: str | None = None, started_at=None) -> None:
    now = timezone.now()
    name = name or f"{role}:{socket.gethostname()}:{os.getpid()}"
    Heartbeat.objects.update_or_create(
        name=name,
        defaults=dict(role=role, host=socket.gethostname(), pid=os.getpid(), seen_at=now, started_at=started_at or now),
    )


def alive(role: str, *, now=None) -> int:
    now = now or timezone.now()
    window = timedelta(seconds=settings.HEARTBEAT_SECONDS * 3)
    return Heartbeat.objects.filter(role=role, seen_at__gte=now - window).count()


def liveness(*, now=None) -> dict:
    now = now or timezone.now()
    window = timedelta(seconds=settings.HEARTBEAT_SECONDS * 3)
    live = Heartbeat.objects.filter(seen_at__gte=now - window).values_list("role", flat=True)
    roles = list(live)
    return {"workers": roles.count("worker"), "queue_services": roles.count("queue_service")}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_is_dead(owner: str) -> bool:
    """A lease owner `host:pid` on this host whose process no longer exists."""
    host, _, pid = owner.rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


_started = False


def start_worker_heartbeat() -> None:
    """Called in qcluster processes: a daemon thread beating for this cluster."""
    global _started
    if _started:
        return
    _started = True
    started_at = timezone.now()
    name = f"worker:{socket.gethostname()}:{os.getpid()}"

    def loop():
        stop = threading.Event()
        while not stop.wait(settings.HEARTBEAT_SECONDS if _started_once.is_set() else 0.5):
            try:
                beat("worker", name=name, started_at=started_at)
                _started_once.set()
            except Exception:
                pass
            finally:
                connection.close()

    threading.Thread(target=loop, name="heartbeat", daemon=True).start()


_started_once = threading.Event()
