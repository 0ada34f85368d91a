"""Every benchmark, side by side: `make bench` (= `python -m bench.run_all`).

Runs each entry of BENCHES on each of its stacks (`sqlite`, `sqlite+orm`, `sqlite+redis`,
`postgresql`, `postgresql+redis`; `a|b`: the first whose servers answer), prints every
figure as it comes, and writes bench/RESULTS.md: the machine, then a table of every figure
with its goal and whether this run meets it. `--quick` runs smaller sizes and writes no
RESULTS.md unless `--results PATH`. Each bench gets DATABASE_URL and REDIS_URL for its
stack (empty: SQLite, the ORM broker); `{database_url}` / `{redis_url}` in its arguments
become the same.

To add a bench:
1. Write `bench/<name>.py` with a `main()`; print every figure through
   `bench.figures.emit(name, value, unit, note, stack=..., goal="< 10 s", met=seconds < 10)`
   (RESULTS.md is built from those; a `print` is only a comment).
2. Name databases and broker clusters on shared servers `runner.prefixed("rs_<name>")`.
3. Add `Bench("bench.<name>", args=..., sizes=..., quick=..., stacks=(...))` to BENCHES.
"""

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import figures

ROOT = Path(__file__).resolve().parent.parent
PG_DEFAULT = "postgres://postgres@127.0.0.1:5432/test"
REDIS_DEFAULT = "redis://127.0.0.1:6379/0"
RESULTS = ROOT / "bench" / "RESULTS.md"
ON_DATABASE = ("--database-url", "{database_url}")
ON_BROKER = ("--redis-url", "{redis_url}")


@dataclass(frozen=True)
class Bench:
    module: str
    args: tuple[str, ...] = ()  # on every run
    sizes: tuple[str, ...] = ()  # the full run's sizes (none: the module's defaults)
    quick: tuple[str, ...] = ()  # the sizes under --quick
    stacks: tuple[str, ...] = ("sqlite",)


BENCHES = [
    # Dispatch overhead, utilization and slot turnover with real workers.
    Bench(
        "bench.throughput",
        args=ON_DATABASE + ON_BROKER,
        quick=("--tasks", "300", "--jobs", "100"),
        stacks=("sqlite+orm", "postgresql+redis"),
    ),
    # The Queue Monitor and status API at 100,000 jobs.
    Bench("bench.monitor_speed", quick=("--jobs", "5000", "--runs", "5"), stacks=("postgresql|sqlite",)),
    # The recovery scan at 100,000 pending + 10,000 processing; a detached poll cycle of 5,000.
    Bench(
        "bench.recovery_scan",
        args=ON_DATABASE,
        quick=("--pending", "5000", "--processing", "500", "--detached", "300", "--single-detached", "100"),
        stacks=("postgresql|sqlite",),
    ),
    # A claim's cost at 100,000 pending jobs, in one project and spread over 1,000 (fair share).
    Bench(
        "bench.claim_backlog", args=ON_DATABASE, quick=("--pending", "5000", "--claims", "50"), stacks=("sqlite", "postgresql")
    ),
    # The same claim with a price and a budget on the record (docs/money.md), side by side.
    Bench(
        "bench.claim_backlog",
        args=(*ON_DATABASE, "--budget"),
        quick=("--pending", "5000", "--claims", "50"),
        stacks=("sqlite", "postgresql"),
    ),
    Bench(
        "bench.claim_backlog",
        args=(*ON_DATABASE, "--projects", "1000"),
        quick=("--pending", "5000", "--claims", "50"),
        stacks=("postgresql",),
    ),
    # A job's completion in a worker to the browser showing it, embedded and with Redis.
    Bench("bench.live_delay", args=("--modes", "embedded"), sizes=("--jobs", "30"), quick=("--jobs", "10")),
    Bench(
        "bench.live_delay",
        args=("--modes", "redis"),
        sizes=("--jobs", "30"),
        quick=("--jobs", "10"),
        stacks=("sqlite+redis",),
    ),
    # A ComfyUI instance's idle time between prompts, and jobs/minute.
    Bench("bench.comfy_throughput", sizes=("--jobs", "30"), quick=("--jobs", "8")),
    # Idle slot-seconds while work waited in a mixed-fault run, and wall time against the ideal.
    Bench(
        "bench.idle_slots",
        args=ON_DATABASE + ON_BROKER,
        sizes=("--jobs", "80"),
        quick=("--jobs", "40"),
        stacks=("postgresql+redis",),
    ),
    # 10,000 drafts from one workflow, and the project, Generate, album and compare pages at 10,000 items.
    Bench("bench.batch_speed", quick=("--drafts", "2000", "--runs", "5"), stacks=("postgresql|sqlite",)),
    # make run from a fresh clone: seconds to the first page, then a second start.
    Bench("bench.cold_start"),
]


def answers_postgres(url: str) -> bool:
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3):
            return True
    except Exception:
        return False


def answers_redis(url: str) -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=3).ping())
    except Exception:
        return False


@dataclass
class Servers:
    pg: str
    redis: str
    has_pg: bool
    has_redis: bool

    def answers(self, stack: str) -> bool:
        return (self.has_pg or not stack.startswith("postgresql")) and (self.has_redis or not stack.endswith("redis"))

    def pick(self, stacks: str) -> str | None:
        """The first of `a|b|…` whose servers answer."""
        return next((stack for stack in stacks.split("|") if self.answers(stack)), None)

    def urls(self, stack: str) -> dict:
        return dict(
            database_url=self.pg if stack.startswith("postgresql") else "",
            redis_url=self.redis if stack.endswith("redis") else "",
        )


def run(module: str, *args: str, env: dict | None = None) -> int:
    print(f"# python -m {module} {' '.join(args)}", flush=True)
    child_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=child_env).returncode


def run_bench(bench: Bench, servers: Servers, *, quick: bool, figures_path: str, notes: list[str]) -> int:
    """The bench on each of its stacks; what was skipped or failed goes on `notes`."""
    status = 0
    for choice in bench.stacks:
        stack = servers.pick(choice)
        if stack is None:
            notes.append(f"{bench.module} [{choice}]: skipped, its servers do not answer")
            print(f"# skipped {bench.module} [{choice}]: its servers do not answer", flush=True)
            continue
        urls = servers.urls(stack)
        args = arguments(bench.args, urls) + list(bench.quick if quick else bench.sizes)
        env = {"DATABASE_URL": urls["database_url"], "REDIS_URL": urls["redis_url"], figures.FIGURES_ENV: figures_path}
        code = run(bench.module, *args, env=env)
        if code:
            notes.append(f"{bench.module} [{stack}]: exited {code}")
        status |= code
    return status


def arguments(template: tuple[str, ...], urls: dict) -> list[str]:
    """`{database_url}` and `{redis_url}` filled in; an option left empty is left out (the
    module's default then: SQLite, the ORM broker)."""
    filled = [arg.format(**urls) for arg in template]
    out = []
    for index, arg in enumerate(filled):
        following = filled[index + 1] if index + 1 < len(filled) else None
        if (arg.startswith("--") and following == "") or (arg == "" and index and filled[index - 1].startswith("--")):
            continue
        out.append(arg)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results", default=None, help=f"where to write the table (default {RESULTS}, none with --quick)")
    args = parser.parse_args(argv)
    results = Path(args.results) if args.results else (None if args.quick else RESULTS)
    pg = os.getenv("DATABASE_URL") or PG_DEFAULT
    rd = os.getenv("REDIS_URL") or REDIS_DEFAULT
    servers = Servers(pg, rd, pg.startswith("postgres") and answers_postgres(pg), answers_redis(rd))
    print(
        f"# PostgreSQL: {'yes' if servers.has_pg else 'no'}; Redis: {'yes' if servers.has_redis else 'no'}; "
        f"cores: {os.cpu_count()}"
    )
    machine = describe_machine(servers)
    with tempfile.NamedTemporaryFile(prefix="bench-figures-", suffix=".jsonl", delete=False) as handle:
        figures_path = handle.name
    notes: list[str] = []
    status = 0
    try:
        for bench in BENCHES:
            status |= run_bench(bench, servers, quick=args.quick, figures_path=figures_path, notes=notes)
        if results is not None:
            results.write_text(results_page(machine, figures.read(figures_path), notes, quick=args.quick))
            print(f"# figures written to {results}", flush=True)
    finally:
        os.unlink(figures_path)
    return status


def describe_machine(servers: Servers) -> list[str]:
    """Cores, memory, load average now, and the versions of the databases."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    versions = [f"SQLite {sqlite3.sqlite_version}"]
    if servers.has_pg:
        versions.insert(0, f"PostgreSQL {server_version_pg(servers.pg)}")
    if servers.has_redis:
        versions.append(f"Redis {server_version_redis(servers.redis)}")
    return [
        f"- cores: {os.cpu_count()}; memory: {memory:.1f} GiB",
        f"- load average at start (1 / 5 / 15 min): {load}",
        f"- databases: {', '.join(versions)}",
    ]


def server_version_pg(url: str) -> str:
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3) as conn:
            return conn.execute("SHOW server_version").fetchone()[0].split()[0]
    except Exception:
        return "?"


def server_version_redis(url: str) -> str:
    try:
        import redis

        return str(redis.Redis.from_url(url, socket_connect_timeout=3).info("server").get("redis_version", "?"))
    except Exception:
        return "?"


def results_page(machine: list[str], rows: list[dict], notes: list[str], *, quick: bool) -> str:
    """bench/RESULTS.md: the machine, then one table row per figure, in the order emitted."""
    command = "python -m bench.run_all --quick" if quick else "make bench"
    out = [
        "# Benchmark results",
        "",
        f"The latest `{command}`, written by bench/run_all.py: every figure of that run (their",
        "notes, sizes and comparisons are in the run's printed output).",
        "",
        *machine,
        "",
        "| figure | stack | value | unit | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        met = {True: "yes", False: "**no**", None: "—"}[row.get("met")]
        cells = [row["name"], row["stack"] or "—", row["value"], row["unit"] or "—", row["goal"] or "—", met]
        out.append("| " + " | ".join(cell(value) for value in cells) + " |")
    judged = [row["met"] for row in rows if row.get("met") is not None]
    out += ["", f"Goals met: {sum(judged)} of {len(judged)}."]
    if notes:
        out += ["", "Skipped or failed in this run:", "", *(f"- {note}" for note in notes)]
    return "\n".join(out) + "\n"


def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.exit(main())
