"""Real processes for tests: qcluster, the queue service, daphne — against the test database.

Use with `@pytest.mark.django_db(transaction=True)` so the children see committed rows.
Each child runs in its own session; `stop()` sends SIGTERM to its main process only (as
`run_stack` does) and `kill()` SIGKILLs its whole process group (a crash). The benchmarks
and the chaos run (bench/runner.py) use the same `Proc` and `wait_for` with their own
environment.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = db.get("USER") or "postgres"
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{db['NAME']}"


def child_env(**extra) -> dict:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="remixstudio.settings",
        DATABASE_URL=database_url(),
        MEDIA_ROOT=str(settings.MEDIA_ROOT),
        DEMO_LEDGER_DIR=str(settings.DEMO_LEDGER_DIR),
        PYTHONUNBUFFERED="1",
    )
    if settings.OUTBOUND_ALLOWLIST:
        env["OUTBOUND_ALLOWLIST"] = ",".join(settings.OUTBOUND_ALLOWLIST)
    if settings.OUTBOUND_ALLOW_HTTP:
        env["OUTBOUND_ALLOW_HTTP"] = "True"
    env.pop("TEST_DB_NAME", None)
    env.update({key: str(value) for key, value in extra.items()})
    return env


class Proc:
    """One child process in its own session, logging to `log_dir`. A restart starts it
    again with a new log file; `log()` reads them all."""

    def __init__(self, name: str, args: list[str], env: dict, log_dir: Path):
        self.name, self.args, self.env, self.log_dir = name, args, env, log_dir
        self.popen = None
        self.logs: list[Path] = []
        self.start()

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{self.name}-{time.monotonic_ns()}.log"
        self.logs.append(path)
        self._log = open(path, "w")
        self.popen = subprocess.Popen(
            self.args, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def pids(self) -> list[int]:
        """The main process and all its children (qcluster's workers)."""
        import psutil

        try:
            main = psutil.Process(self.popen.pid)
            return [main.pid] + [child.pid for child in main.children(recursive=True)]
        except psutil.Error:
            return []

    def stop(self, timeout: float = 30) -> int | None:
        """Graceful: SIGTERM to the main process only (as run_stack does), SIGKILL the
        group after `timeout`; stragglers of the group are killed either way."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return self.popen.returncode
        self._kill_group()
        self._log.close()
        return self.popen.returncode

    def kill(self) -> None:
        """A crash: SIGKILL the whole process group, no chance to clean up."""
        self._kill_group()
        self.popen.wait(timeout=30)
        self._log.close()

    def restart(self) -> None:
        if self.alive():
            self.kill()
        self.start()

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return "".join(path.read_text(errors="replace") for path in self.logs if path.exists())

    def _kill_group(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def manage(name: str, *command: str, log_dir: Path, **env) -> Proc:
    return Proc(name, [sys.executable, str(ROOT / "manage.py"), *command], child_env(**env), log_dir)


def qcluster(log_dir: Path, *, workers: int = 4, **env) -> Proc:
    return manage("qcluster", "qcluster", log_dir=log_dir, QUEUE_WORKERS=workers, **env)


def queue_service(log_dir: Path, **env) -> Proc:
    return manage("queue_service", "queue_service", log_dir=log_dir, **env)


def wait_for(predicate, *, timeout: float = 60, interval: float = 0.2, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {message}")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def daphne(log_dir: Path, *, port: int | None = None, **env) -> Proc:
    """The web process (HTTP + WebSocket) on 127.0.0.1:`port`; `proc.url` is its base URL."""
    port = port or free_port()
    args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "remixstudio.asgi:application"]
    proc = Proc("daphne", args, child_env(**env), log_dir)
    proc.url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _accepts(port) or not proc.alive(), timeout=60, message="daphne to listen")
    if not proc.alive():
        raise AssertionError("daphne exited:\n" + proc.log())
    return proc


def _accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
