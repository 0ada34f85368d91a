"""Child processes for benchmarks and the chaos run, and the database they use.

The processes are tests/procs.py's `Proc` (SIGKILL = a crash of the whole group,
SIGTERM = a graceful stop of the main process, restart); what differs for scripts outside
pytest is the environment, built from an explicit `Stack` (database URL, Redis URL,
cluster name, media root) instead of the test database.
"""

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.procs import Proc, wait_for

ROOT = Path(__file__).resolve().parent.parent

__all__ = [
    "Proc",
    "Stack",
    "database_url",
    "fresh_dir",
    "manage",
    "migrate",
    "prefixed",
    "print_failures",
    "purge_broker",
    "recreate_database",
    "stop_all",
    "wait_for",
    "with_database",
]
PREFIX_ENV = "BENCH_DB_PREFIX"


def prefixed(name: str) -> str:
    """A database or broker cluster name on a shared server: BENCH_DB_PREFIX (empty unless
    set) + `name`, so two people's benches on one PostgreSQL and Redis never drop or read
    each other's (`BENCH_DB_PREFIX=ann_ make bench`)."""
    return os.getenv(PREFIX_ENV, "") + name


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

    def prepare(self) -> None:
        """A fresh, migrated database and an empty broker, and this process set up on
        them (django.setup()): what every benchmark and the chaos run start from."""
        recreate_database(self.database_url)
        migrate(self)
        purge_broker(self)
        self.apply()
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        import django

        django.setup()


# The chaos runs' processes have DEBUG off, which needs a Fernet key of their own.
CHAOS_FERNET_KEY = "Y2hhb3MtcnVuLWZlcm5ldC1rZXktMzItYnl0ZXMhISE="


def chaos_env(*, fake_port: int, workers: int, secret: str, **overrides) -> dict:
    """The environment of a stack run against the chaos fake provider on `fake_port`:
    cadences faster than production so a few minutes hold many cycles (each is stated
    in the run's output), production's DEBUG off, and `overrides` on top."""
    env = dict(
        OUTBOUND_ALLOWLIST=f"127.0.0.1:{fake_port}",
        OUTBOUND_ALLOW_HTTP="True",
        QUEUE_WORKERS=workers,
        JOB_PROCESSING_TIMEOUT_MS=20000,
        BACKOFF_BASE_SECONDS=0.5,
        BACKOFF_CAP_SECONDS=4,
        HEARTBEAT_SECONDS=2,
        CLAIM_TTL_SECONDS=10,
        LOG_LEVEL="INFO",
        DEBUG="False",
        SECRET_KEY=f"{secret}-secret-key-" + "x" * 40,
        FIELD_ENCRYPTION_KEY=CHAOS_FERNET_KEY,
        ALLOWED_HOSTS="localhost,127.0.0.1,testserver",
    )
    env.update(overrides)
    return env


def fresh_dir(path: Path) -> Path:
    """`path`, emptied: every run starts without the last one's logs, media and files."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def database_url(server_url: str, name: str, sqlite_file: Path) -> str:
    """Database `name` on the server of `server_url` (PostgreSQL), or `sqlite_file` without one."""
    return with_database(server_url, name) if server_url else f"sqlite:///{sqlite_file}"


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

    # django-q2's Redis broker keeps its list under django_q:<cluster name>:q.
    redis.Redis.from_url(stack.redis_url).delete(f"django_q:{stack.cluster_name}:q")


def manage(stack: Stack, name: str, *command: str, log_dir: Path, **env) -> Proc:
    return Proc(name, [sys.executable, str(ROOT / "manage.py"), *command], stack.env(**env), log_dir)


def stop_all(procs) -> None:
    """Stop each process gracefully, SIGKILL the ones that do not stop."""
    for proc in procs:
        try:
            proc.stop(timeout=30)
        except Exception:
            proc.kill()


def print_failures(title: str, failures: list[str]) -> None:
    print(f"{title} FAILED:")
    for failure in failures:
        print("  - " + failure)
