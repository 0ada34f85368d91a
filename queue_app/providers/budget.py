"""Status-request budgets: how many status checks a provider record may send a minute,
and whether that covers its detached tasks within their cadence.

The default comes from the family's documented limit (`STATUS_PER_MINUTE` in its
module: Replicate documents 3,000 requests a minute for every endpoint but create); a
record overrides it with the `status_per_minute` option (bounds in queue_app/limits.py)
for an account on a lower tier. A family with a list/batch status endpoint declares
`STATUS_BATCH`, the tasks one request reports on, and one such request counts once.

The poller spends the budget through a `Spacing` per record: requests start at least
60/budget seconds apart, so no minute-long window ever holds more than the budget. The
monitor asks `shortfall` whether the budget can check every task once per cadence."""

import math
import threading
import time
from dataclasses import dataclass

from queue_app import limits
from queue_app.providers import adapter_for, poll_seconds
from queue_app.providers.base import ProviderError

# A family whose limit is not documented (or is per tier): a rate far from any tier's
# limit that still covers a thousand 30-second tasks.
UNDOCUMENTED_PER_MINUTE = 600


def _adapter(family: str):
    try:
        return adapter_for(family)
    except ProviderError:
        return None


def per_minute(family: str, options: dict | None = None) -> int:
    """Status requests a minute for a record of `family` with `options`."""
    own = (options or {}).get("status_per_minute")
    if limits.STATUS_PER_MINUTE.contains(own):
        return int(own)
    documented = getattr(_adapter(family), "STATUS_PER_MINUTE", None)
    return int(documented or UNDOCUMENTED_PER_MINUTE)


def batch_size(family: str, *, adapter=None) -> int:
    """Tasks one status request can report on (1: the family checks one task a request).
    `adapter`: the family's module as the caller already looked it up."""
    adapter = adapter or _adapter(family)
    if adapter is None or not hasattr(adapter, "check_page"):
        return 1
    return max(1, int(getattr(adapter, "STATUS_BATCH", 1)))


def requests_for(family: str, tasks: int) -> int:
    """Status requests that check `tasks` tasks of `family` once."""
    return math.ceil(tasks / batch_size(family)) if tasks > 0 else 0


@dataclass(frozen=True)
class Shortfall:
    tasks: int  # tasks the budget leaves unchecked in one cadence
    cycle_seconds: float  # how long one round of every task takes at the budget
    cadence_seconds: float


def shortfall(family: str, options: dict | None, tasks: int) -> Shortfall | None:
    """None when the budget checks all `tasks` within the family's cadence; otherwise how
    far it falls short."""
    if tasks <= 0:
        return None
    budget = per_minute(family, options)
    cadence = poll_seconds(family)
    cycle = requests_for(family, tasks) * 60.0 / budget
    if cycle <= cadence:
        return None
    covered = int(budget * cadence / 60.0) * batch_size(family)
    return Shortfall(tasks=max(1, tasks - covered), cycle_seconds=cycle, cadence_seconds=cadence)


class Spacing:
    """Requests of one provider record start at least 60/per_minute seconds apart: a
    half-open minute never holds more than `per_minute` of them. Turns are reserved (so a
    claim takes only what the next moments allow) and waited for just before sending."""

    def __init__(self, per_minute: int, *, clock=time.monotonic, sleep=time.sleep):
        self.gap = 60.0 / max(1, per_minute)
        self._clock, self._sleep = clock, sleep
        self._next = float("-inf")
        self._lock = threading.Lock()

    def set_rate(self, per_minute: int) -> None:
        with self._lock:
            self.gap = 60.0 / max(1, per_minute)

    def free(self, horizon: float) -> int:
        """Turns that would start within `horizon` seconds from now."""
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            if start >= now + horizon:
                return 0
            return int((now + horizon - start) // self.gap) + 1

    def reserve(self, count: int = 1) -> list[float]:
        """The start times of `count` turns, each a gap after the previous."""
        with self._lock:
            start = max(self._clock(), self._next)
            turns = [start + n * self.gap for n in range(count)]
            if turns:
                self._next = turns[-1] + self.gap
            return turns

    def wait_until(self, turn: float) -> None:
        delay = turn - self._clock()
        if delay > 0:
            self._sleep(delay)

    def take(self) -> None:
        """Reserve a turn and wait for it (a request no claim planned for)."""
        self.wait_until(self.reserve(1)[0])
