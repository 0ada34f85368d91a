"""Child processes for benchmarks and the chaos run, and the database they use.

Like tests/procs.py, but for scripts outside pytest: the environment is built from an
explicit `Stack` (database URL, Redis URL, cluster name, media root) instead of the test
database, and a process can be SIGKILLed (a crash: its whole group), SIGTERMed (a
graceful stop: its main process only, as run_stack does) and restarted.
"""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Stack:
    database_url: str
    redis_url: str = ""
    cluster_name: str = "rs_bench"
    var_dir: Path = ROOT / "var" / "bench"
    extra: dict = field(default_factory=dict)

    def env(self, **more) -> dict:
        env = dict(os.environ)
        for key in ("TEST_DB_NAME", "FAILPOINTS", "REDIS_URL", "DATABASE_URL"):
            env.pop(key, None)
        env.update(
            DJANGO_SETTINGS_MODULE="remixstudio.settings",
            DATABASE_URL=self.database_url,
            Q_CLUSTER_NAME=self.cluster_name,
            CHANNELS_PREFIX=self.cluster_name,
            VAR_DIR=str(self.var_dir),
            MEDIA_ROOT=str(self.var_dir / "media"),
            DEMO_LEDGER_DIR=str(self.var_dir / "ledger"),
            PYTHONUNBUFFERED="1",
        )
        if self.redis_url:
            env["REDIS_URL"] = self.redis_url
        env.update({key: str(value) for key, value in {**self.extra, **more}.items()})
        return env

    def apply(self) -> None:
        """Make this process use the stack (call before django.setup())."""
        for key in ("TEST_DB_NAME", "FAILPOINTS", "REDIS_URL"):
            os.environ.pop(key, None)
        os.environ.update(self.env())


def with_database(url: str, name: str) -> str:
    """The same server, another database (PostgreSQL), or another file (SQLite)."""
    parts = urlsplit(url)
    if parts.scheme.startswith("sqlite"):
        return f"sqlite:///{name}"
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def recreate_database(url: str) -> None:
    """Drop and create the database `url` names (PostgreSQL), or delete the SQLite file."""
    parts = urlsplit(url)
    if parts.scheme.startswith("sqlite"):
        path = Path(parts.path[1:] if parts.path.startswith("//") else parts.path)
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    import psycopg

    name = parts.path.lstrip("/")
    admin = urlunsplit((parts.scheme.replace("postgresql", "postgres"), parts.netloc, "/postgres", "", ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def migrate(stack: Stack) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=stack.env(), check=True
    )


def purge_broker(stack: Stack) -> None:
    """Forget tasks a previous run left in the Redis list of this cluster name."""
    if not stack.redis_url:
        return
    import redis

    redis.Redis.from_url(stack.redis_url).delete(stack.cluster_name)


class Proc:
    def __init__(self, name: str, args: list[str], env: dict, log_dir: Path):
        self.name, self.args, self.env, self.log_dir = name, args, env, log_dir
        self.popen = None
        self.logs: list[Path] = []
        self.start()

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{self.name}-{len(self.logs)}.log"
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

    def kill(self) -> None:
        """A crash: SIGKILL the whole process group."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=30)
        self._log.close()

    def stop(self, timeout: float = 30) -> int | None:
        """Graceful: SIGTERM to the main process only; SIGKILL the group after `timeout`."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return self.popen.returncode
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)  # stragglers of the group
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()
        return self.popen.returncode

    def restart(self) -> None:
        if self.alive():
            self.kill()
        self.start()

    def log_text(self) -> str:
        return "".join(path.read_text(errors="replace") for path in self.logs if path.exists())


def manage(stack: Stack, name: str, *command: str, log_dir: Path, **env) -> Proc:
    return Proc(name, [sys.executable, str(ROOT / "manage.py"), *command], stack.env(**env), log_dir)


def wait_for(predicate, *, timeout: float, interval: float = 0.2, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {message}")
