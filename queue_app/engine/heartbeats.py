"""Liveness of our processes, from the database alone.

Worker clusters (qcluster), queue services and web processes (daphne) write a heartbeat
row every HEARTBEAT_SECONDS. The monitor warns when dispatchable work has nobody alive to take
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

from queue_app.engine.clock import db_now
from queue_app.models import Heartbeat


def process_name() -> str:
    """This process as a lease owner, attempt worker or instance driver: `host:pid`, which
    `owner_is_dead` reads back."""
    return f"{socket.gethostname()}:{os.getpid()}"


def beat(role: str, *, name: str | None = None, started_at=None, children: list[int] | None = None) -> None:
    # The database's time: other hosts compare it with theirs (engine/clock.py).
    now = db_now()
    name = name or f"{role}:{socket.gethostname()}:{os.getpid()}"
    fields = dict(role=role, host=socket.gethostname(), pid=os.getpid(), seen_at=now, started_at=started_at or now)
    if children is not None:
        fields["children"] = children
    # a process that beats is alive: a host cut off and back clears its tombstone
    Heartbeat.objects.update_or_create(name=name, defaults=dict(fields, released_at=None))


def fresh(*, now=None):
    """Heartbeats of live processes: beaten within three periods, and not found dead."""
    window = timedelta(seconds=settings.HEARTBEAT_SECONDS * 3)
    return Heartbeat.objects.filter(seen_at__gte=(now or db_now()) - window, released_at__isnull=True)


def alive(role: str, *, now=None) -> int:
    return fresh(now=now).filter(role=role).count()


def liveness(*, now=None) -> dict:
    live = fresh(now=now).values_list("role", flat=True)
    roles = list(live)
    return {"workers": roles.count("worker"), "queue_services": roles.count("queue_service")}


def pid_alive(pid: int) -> bool:
    """A process on this host that still runs. A zombie (exited, not yet reaped by its
    parent: a qcluster worker between its crash and the sentinel's next guard cycle, or
    the workers of a killed cluster until init reaps them) holds nothing and counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The state follows the command name in parentheses, which may itself hold ") ".
            return stat.read().rpartition(b") ")[2][:1] in (b"Z", b"X")
    except OSError:
        return False  # no /proc (not Linux) or it vanished meanwhile: os.kill already answered


def owner_is_dead(owner: str, *, now=None) -> bool:
    """A lease owner `host:pid` whose process no longer exists: on this host, asked of the
    kernel; on another host, when that host's processes have all stopped beating (the
    lease stays the backstop for a host that never beat at all)."""
    host, _, pid = owner.rpartition(":")
    if not pid.isdigit():
        return False
    if host == socket.gethostname():
        return not pid_alive(int(pid))
    return bool(host) and host_is_silent(host, now=now)


def death_is_certain(owner: str) -> bool:
    """Only the kernel of the owner's own host can tell a dead process from a live one cut
    off by the network; another host's silence may be a partition, its workers still
    inside provider calls."""
    host, _, pid = owner.rpartition(":")
    return pid.isdigit() and host == socket.gethostname() and not pid_alive(int(pid))


def host_is_silent(host: str, *, now=None) -> bool:
    """A host that beat before and whose processes have all missed three beats."""
    return Heartbeat.objects.filter(host=host).exists() and not fresh(now=now).filter(host=host).exists()


def dead_clusters(*, now=None) -> list[int]:
    """Heartbeat ids of worker clusters that are gone: the process is dead on this host,
    or it missed three beats (any host)."""
    now = now or db_now()
    window = timedelta(seconds=settings.HEARTBEAT_SECONDS * 3)
    dead = []
    clusters = Heartbeat.objects.filter(role="worker", released_at__isnull=True)
    for beat_id, host, pid, seen_at in clusters.values_list("id", "host", "pid", "seen_at"):
        if seen_at < now - window or (host == socket.gethostname() and not pid_alive(pid)):
            dead.append(beat_id)
    return dead


_started: set[str] = set()

# A qcluster forks its sentinel, workers and pusher from the process whose heartbeat thread
# writes. A child forked while that thread's SQLite connection held a lock inherits
# SQLite's in-process record of the lock without the lock itself, and waited on it until
# "database is locked" (the cluster stopped taking tasks for minutes; SQLite's own
# documentation forbids carrying a connection across fork). Each beat, its connection
# closed after it, is one critical section that a fork waits for.
_beating = threading.Lock()
os.register_at_fork(before=_beating.acquire, after_in_parent=_beating.release, after_in_child=_beating.release)


def start_worker_heartbeat() -> None:
    """Called in qcluster processes: a daemon thread beating for this cluster."""
    start_process_heartbeat("worker")


def start_process_heartbeat(role: str) -> None:
    """A daemon thread beating for this process as `role` ("worker" in a qcluster, "web"
    in a serving daphne); once per process and role. It opens its own connection and
    closes it after each beat, so it holds none between beats."""
    if role in _started:
        return
    _started.add(role)
    started_at = timezone.now()
    name = f"{role}:{socket.gethostname()}:{os.getpid()}"
    first = threading.Event()
    known: list[int] = []  # this cluster's processes, recent ones first

    def loop():
        stop = threading.Event()
        while not stop.wait(settings.HEARTBEAT_SECONDS if first.is_set() else 0.5):
            children = None
            if role == "worker":
                children = remember(known, descendants(os.getpid()))
            # No fork mid-beat (_beating): qcluster forks its processes from this one.
            with _beating:
                try:
                    beat(role, name=name, started_at=started_at, children=children)
                    first.set()
                except Exception:
                    pass
                finally:
                    connection.close()

    threading.Thread(target=loop, name=f"heartbeat-{role}", daemon=True).start()


KNOWN_CHILDREN = 64  # pids kept per cluster: recycled workers' too, for the attempts they ran


def remember(known: list[int], current: list[int]) -> list[int]:
    """`known` updated with `current` (current ones first, then older ones), bounded."""
    known[:] = (current + [pid for pid in known if pid not in current])[:KNOWN_CHILDREN]
    return list(known)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren), read from /proc; [] where there
    is no /proc. qcluster's workers are its sentinel's children."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                ppid = int(stat.read().rpartition(b") ")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)
