"""The database's clock: the one clock every process of every host agrees on.

Leases, claims, heartbeats and due times are written by one process and compared by
another, often on another host. A host whose clock runs ahead would read every other
host's heartbeat as stale and its leases and claims as lapsed (an early heal, a stolen
claim), so any moment that is compared across processes comes from here — or is an
`Now()` expression in the query itself — never from the process's own clock.
"""

from django.db import connection
from django.utils import timezone


def db_now():
    """The database server's current time (aware). SQLite runs inside this process, so its
    clock is the process's."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        # statement_timestamp(), not now(): now() is frozen at the start of a transaction.
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]
