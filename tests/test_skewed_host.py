"""Scenario 7 of bench/chaos_faults.py simulates a host whose wall clock is 60 s ahead. A
real such host has only CLOCK_REALTIME wrong: its monotonic clock, sleeps and timed waits
are right. The simulation must be the same, or what the scenario measures is the fake's
doing: under Debian's libfaketime every `threading.Event.wait(timeout)` of the faked
process hung, its workers' leases were never renewed, and the queue service healed their
long jobs (seeds 101 and 109).
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from bench import chaos_faults

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="the clock shim needs a C compiler")

PROBE = """
import datetime, json, threading, time
began = time.monotonic()
threading.Event().wait(0.2)
waited = time.monotonic() - began
time.sleep(0.05)
print(json.dumps({
    "wall": time.time(),
    "datetime": datetime.datetime.now(datetime.timezone.utc).timestamp(),
    "monotonic": time.monotonic(),
    "waited": waited,
}))
"""


def _run_on_the_skewed_host() -> tuple[dict, float, float]:
    env = {**os.environ, **chaos_faults.clock_ahead_env()}
    wall, monotonic = time.time(), time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("a timed wait of 0.2 s did not return within 20 s on the simulated host")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), wall, monotonic


def test_the_simulated_host_reads_its_wall_clock_60_s_ahead():
    seen, wall, _ = _run_on_the_skewed_host()
    ahead = chaos_faults.CLOCK_AHEAD_SECONDS
    assert ahead <= seen["wall"] - wall < ahead + 10
    assert ahead <= seen["datetime"] - wall < ahead + 10


def test_the_simulated_host_keeps_its_monotonic_clock_and_timed_waits():
    seen, _, monotonic = _run_on_the_skewed_host()
    assert 0.2 <= seen["waited"] < 2
    assert 0 <= seen["monotonic"] - monotonic < 10
