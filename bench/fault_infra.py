"""Private PostgreSQL and Redis servers for bench/chaos_faults.py (root only).

`PrivateInfra` starts a PostgreSQL 15 cluster and a Redis server of our own on free ports
in a temporary directory, so the faults (a PostgreSQL restart, a Redis restart without
persistence) never touch the shared servers; it restarts and stops them on demand and
removes everything at the end.
"""

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from bench import runner

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port(start: int) -> int:
    for port in range(start, start + 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port from {start}")


def ensure_tools() -> None:
    missing = [
        pkg for pkg, path in (("gcc", Path("/usr/bin/cc")), ("redis-server", Path("/usr/bin/redis-server"))) if not path.exists()
    ]
    if not (PG_BIN / "initdb").exists():
        missing.append("postgresql-15")
    if missing:
        subprocess.run(
            ["apt-get", "install", "-y", *missing], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        )


class PrivateInfra:
    """A PostgreSQL cluster and a Redis server of our own, in a temporary directory."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="chaos-faults-"))
        self.pg_port = free_port(55532)
        self.redis_port = free_port(56479)
        self.pgdata = self.dir / "pg"
        self.pg_started = self.redis_started = False

    @property
    def database_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.pg_port}/postgres"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def _pg(self, *args: str, check: bool = True) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *args], check=check, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )

    def start(self) -> None:
        shutil.chown(self.dir, "postgres")
        self._pg(str(PG_BIN / "initdb"), "-D", str(self.pgdata), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-p {self.pg_port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-o", options, "-l", str(self.dir / "pg.log"), "-w", "start")
        self.pg_started = True
        self.start_redis()

    def start_redis(self) -> None:
        subprocess.run(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--daemonize", "yes", "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")],
            check=True,
        )
        self.redis_started = True
        runner.wait_for(self._redis_up, timeout=10, message="the private Redis to answer")

    def _redis_up(self) -> bool:
        return (
            subprocess.run(["redis-cli", "-p", str(self.redis_port), "ping"], capture_output=True, text=True).stdout.strip()
            == "PONG"
        )

    def restart_postgres(self) -> None:
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "restart")

    def stop_redis(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"], capture_output=True)
        runner.wait_for(lambda: not self._redis_up(), timeout=10, message="the private Redis to stop")

    def redis_queued(self, key: str) -> int:
        out = subprocess.run(["redis-cli", "-p", str(self.redis_port), "llen", key], capture_output=True, text=True).stdout
        return int(out.strip() or 0)

    def stop(self) -> None:
        if self.redis_started:
            subprocess.run(["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"], capture_output=True)
        if self.pg_started:
            self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
