"""Retries: the delay before the next try (exponential backoff with full jitter), and the
reason a job gives with when its tries are used up."""

import random

from django.conf import settings


def ceiling(attempt: int, *, base: float | None = None, cap: float | None = None) -> float:
    """The largest delay after the `attempt`-th failure (1-based): min(cap, base·2^(n-1))."""
    base = settings.BACKOFF_BASE_SECONDS if base is None else base
    cap = settings.BACKOFF_CAP_SECONDS if cap is None else cap
    return min(cap, base * 2 ** max(0, attempt - 1))


def delay(attempt: int, *, base: float | None = None, cap: float | None = None, rng=random) -> float:
    """Full jitter: uniform over [0, ceiling] (AWS architecture blog), so many jobs that
    failed together do not come back together."""
    return rng.uniform(0, ceiling(attempt, base=base, cap=cap))


def give_up_reason(attempts: int, last: str) -> str:
    """The reason of a job that failed because its tries are used up."""
    return f"gave up after {attempts} attempts, last: {last}"
