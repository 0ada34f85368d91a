"""Private services and simulated hosts for the multi-host chaos run (root only).

- `Network`: a bridge in the root namespace (GATEWAY) and one network namespace per
  host, joined to it by a veth; a host's processes run in its namespace under their own
  UTS hostname, so lease owners (`host:pid`) are told apart as on real machines.
- `PrivatePostgres` / `PrivateRedis`: servers of our own on free ports, listening on
  127.0.0.1 and the gateway, so faults (a partition, a host's death) never touch the
  shared servers other engineers and CI use.
- `partition` / `heal`: an nftables table in one namespace that silently drops its
  traffic to the database and Redis (the provider stays reachable), as a cut link does.

Everything made here is registered for teardown at exit and on SIGINT/SIGTERM, also when
a run fails half-way.
"""

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PREFIX = "rsch"
SUBNET = "10.77.0"
GATEWAY = f"{SUBNET}.1"
BRIDGE = f"{PREFIX}-br"
PG_BIN = Path("/usr/lib/postgresql/15/bin")

_teardown: list = []


def run(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, input=input)


def ensure_tools() -> None:
    """iproute2 and nftables from Debian when absent (the machine and CI are root)."""
    missing = [pkg for tool, pkg in (("ip", "iproute2"), ("nft", "nftables")) if not shutil.which(tool)]
    if missing:
        print(f"# installing {', '.join(missing)} (apt-get)", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env, capture_output=True)


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError("no free port")


def on_teardown(fn) -> None:
    _teardown.append(fn)


def teardown() -> None:
    """Undo everything, newest first; each step on its own so one failure stops nothing."""
    while _teardown:
        fn = _teardown.pop()
        try:
            fn()
        except Exception as error:  # teardown must go on
            print(f"# teardown step failed: {error}", flush=True)


def _on_signal(signum, frame):
    teardown()
    raise SystemExit(128 + signum)


atexit.register(teardown)
signal.signal(signal.SIGTERM, _on_signal)


class Network:
    def __init__(self, hosts: list[str]):
        self.hosts = {name: f"{SUBNET}.{11 + index}" for index, name in enumerate(hosts)}
        self.created: list[str] = []

    def namespace(self, host: str) -> str:
        return f"{PREFIX}-{host}"

    def up(self) -> "Network":
        self.clean_leftovers()
        on_teardown(self.down)
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        for host, address in self.hosts.items():
            ns = self.namespace(host)
            run("ip", "netns", "add", ns)
            self.created.append(ns)
            run("ip", "link", "add", f"{ns}0", "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "link", "set", f"{ns}0", "master", BRIDGE, "up")
            run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def clean_leftovers(self) -> None:
        """A run killed with SIGKILL leaves its namespaces and bridge behind."""
        names = run("ip", "netns", "list", check=False).stdout.split()
        for name in names:
            if name.startswith(f"{PREFIX}-"):
                self.kill_all(name)
                run("ip", "netns", "del", name, check=False)
        run("ip", "link", "del", BRIDGE, check=False)

    def down(self) -> None:
        for ns in self.created:
            self.kill_all(ns)
            run("ip", "netns", "del", ns, check=False)
        run("ip", "link", "del", BRIDGE, check=False)

    def pids(self, host_or_ns: str) -> list[int]:
        ns = host_or_ns if host_or_ns.startswith(f"{PREFIX}-") else self.namespace(host_or_ns)
        out = run("ip", "netns", "pids", ns, check=False).stdout
        return [int(pid) for pid in out.split()]

    def kill_all(self, host_or_ns: str) -> list[int]:
        """SIGKILL every process of a namespace at once: the host dies whole."""
        pids = self.pids(host_or_ns)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def command(self, host: str, *args: str) -> list[str]:
        """`args` run in the host's namespace under its own hostname; the execs keep one pid."""
        return [
            "ip",
            "netns",
            "exec",
            self.namespace(host),
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            host,
            *args,
        ]

    def partition(self, host: str, ports: list[int]) -> None:
        """Drop, silently, the host's traffic to and from these ports at the gateway."""
        ports_set = ", ".join(str(p) for p in ports)
        rules = f"""
table inet {PREFIX}_partition {{
  chain out {{ type filter hook output priority 0; ip daddr {GATEWAY} tcp dport {{ {ports_set} }} drop; }}
  chain in {{ type filter hook input priority 0; ip saddr {GATEWAY} tcp sport {{ {ports_set} }} drop; }}
}}
"""
        run("ip", "netns", "exec", self.namespace(host), "nft", "-f", "-", input=rules)

    def heal(self, host: str) -> None:
        run("ip", "netns", "exec", self.namespace(host), "nft", "delete", "table", "inet", f"{PREFIX}_partition", check=False)


class PrivatePostgres:
    """A throwaway PostgreSQL 15 cluster in a temp dir, run as the postgres user."""

    def __init__(self, port: int = 55432, listen: tuple = ("127.0.0.1", GATEWAY)):
        self.port = free_port(port)
        self.listen = listen
        self.dir = Path(tempfile.mkdtemp(prefix="rsch-pg-"))

    def url(self, host: str = "127.0.0.1", database: str = "postgres") -> str:
        return f"postgres://postgres@{host}:{self.port}/{database}"

    def start(self) -> "PrivatePostgres":
        on_teardown(self.stop)
        shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        pg = ["runuser", "-u", "postgres", "--"]
        run(*pg, str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses='{','.join(self.listen)}' "
            "-c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        run(*pg, str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "log"), "-o", options, "-w", "start")
        return self

    def stop(self) -> None:
        data = self.dir / "data"
        if (data / "postmaster.pid").exists():
            run(
                "runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop", check=False
            )
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    def __init__(self, port: int = 56379, listen: tuple = ("127.0.0.1", GATEWAY)):
        self.port = free_port(port)
        self.listen = listen
        self.dir = Path(tempfile.mkdtemp(prefix="rsch-redis-"))
        self.pidfile = self.dir / "redis.pid"

    def url(self, host: str = "127.0.0.1", db: int = 0) -> str:
        return f"redis://{host}:{self.port}/{db}"

    def start(self) -> "PrivateRedis":
        on_teardown(self.stop)
        run(
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            " ".join(self.listen),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--daemonize",
            "yes",
            "--dir",
            str(self.dir),
            "--pidfile",
            str(self.pidfile),
            "--logfile",
            str(self.dir / "log"),
        )
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        try:
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)
