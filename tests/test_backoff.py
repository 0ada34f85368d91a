"""Exponential backoff with full jitter stays inside its bound."""

import random

import pytest

from queue_app.engine import backoff


@pytest.mark.parametrize("attempt", range(1, 12))
def test_every_delay_is_within_zero_and_the_capped_exponential(attempt):
    rng = random.Random(attempt)
    bound = min(60, 2 * 2 ** (attempt - 1))
    delays = [backoff.delay(attempt, base=2, cap=60, rng=rng) for _ in range(500)]
    assert all(0 <= d <= bound for d in delays)
    # full jitter spreads over the whole range, not just near the top
    assert min(delays) < bound * 0.1 and max(delays) > bound * 0.9


def test_the_ceiling_doubles_until_the_cap():
    assert [backoff.ceiling(n, base=2, cap=60) for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]
