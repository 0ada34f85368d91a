"""`make run`'s command, `manage.py run_stack --prepare`, on a database that has never
been migrated: it migrates, serves the first page, makes the demo account, runs the
recovery scan before the workers start, and stops on SIGTERM. Started again it migrates
nothing. (How long a cold `make run` takes is bench/cold_start.py's.)"""

import urllib.request

import pytest

from tests import procs

pytestmark = pytest.mark.processes


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def start(tmp_path, port):
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    env = dict(DATABASE_URL=fresh, REDIS_URL="", VAR_DIR=tmp_path, DEBUG="True", PORT=port)
    stack = procs.manage("run_stack", "run_stack", "--prepare", log_dir=tmp_path / "logs", **env)
    procs.wait_for(lambda: answers(f"http://127.0.0.1:{port}/accounts/login/") or not stack.alive(), message="the first page")
    assert stack.alive(), stack.log()
    procs.wait_for(lambda: "queue |" in stack.log(), message="the queue service started")
    return stack


def test_run_stack_prepares_a_fresh_database_and_serves_the_first_page(tmp_path):
    port = procs.free_port()
    stack = start(tmp_path, port)
    assert stack.stop() == 0
    log = stack.log()
    assert "Applying queue_app.0001_initial" in log and "demo account: username 'demo'" in log
    assert log.index("recovery scan:") < log.index("Remix Studio Queue is running")
    assert "stopped: web" in log
    again = start(tmp_path, procs.free_port())
    assert again.stop() == 0
    assert "Applying" not in again.log() and "demo account 'demo' exists" in again.log()
