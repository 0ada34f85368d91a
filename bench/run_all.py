"""Every benchmark, side by side: `make bench` (= `python -m bench.run_all`).

Each figure is one line: `bench.<name>[<stack>] <value> <unit> (<comparison>)`.

- dispatch overhead, slot turnover and utilization (bench/throughput.py) on SQLite + ORM
  broker, and on PostgreSQL + Redis when they answer (DATABASE_URL / REDIS_URL, or the
  local defaults);
- the Queue Monitor and status API at 100,000 jobs (bench/monitor_speed.py, when present);
- the recovery scan at 100,000 pending + 10,000 processing and one detached poll cycle of
  5,000 jobs at 100 ms per check (bench/recovery_scan.py; PostgreSQL when it answers);
- the delay from a job's completion in a worker to the browser showing it, embedded and
  with Redis (bench/live_delay.py);
- a ComfyUI instance's idle time between prompts and jobs/minute (bench/comfy_throughput.py);
- a claim's cost at 100,000 pending jobs (bench/claim_backlog.py; both databases);
- idle slot-seconds while work waited in a mixed-fault run, per provider, and wall time
  against the ideal (bench/idle_slots.py, 80 jobs; PostgreSQL + Redis only).

`--quick` runs smaller sizes (a development check, not figures to track).
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_DEFAULT = "postgres://postgres@127.0.0.1:5432/test"
REDIS_DEFAULT = "redis://127.0.0.1:6379/0"


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


def run(module: str, *args: str, env: dict | None = None) -> int:
    print(f"# python -m {module} {' '.join(args)}", flush=True)
    child_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=child_env).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    pg = os.getenv("DATABASE_URL") or PG_DEFAULT
    rd = os.getenv("REDIS_URL") or REDIS_DEFAULT
    has_pg = pg.startswith("postgres") and answers_postgres(pg)
    has_redis = answers_redis(rd)
    print(f"# PostgreSQL: {'yes' if has_pg else 'no'}; Redis: {'yes' if has_redis else 'no'}; cores: {os.cpu_count()}")
    sizes = ["--tasks", "300", "--jobs", "100"] if args.quick else []
    status = 0
    status |= run("bench.throughput", *sizes, env={"DATABASE_URL": "", "REDIS_URL": ""})
    if has_pg and has_redis:
        status |= run("bench.throughput", "--database-url", pg, "--redis-url", rd, *sizes)
    if (ROOT / "bench" / "monitor_speed.py").exists():
        monitor_args = ["--jobs", "5000", "--runs", "5"] if args.quick else []
        status |= run("bench.monitor_speed", *monitor_args, env={"DATABASE_URL": pg if has_pg else ""})
    scan = ["--pending", "5000", "--processing", "500", "--detached", "300", "--single-detached", "100"] if args.quick else []
    if has_pg:
        status |= run("bench.recovery_scan", "--database-url", pg, *scan)
    else:
        status |= run("bench.recovery_scan", *scan, env={"DATABASE_URL": ""})
    backlog = ["--pending", "5000", "--claims", "50"] if args.quick else []
    status |= run("bench.claim_backlog", *backlog, env={"DATABASE_URL": ""})
    if has_pg:
        status |= run("bench.claim_backlog", "--database-url", pg, *backlog)
    modes = "embedded,redis" if has_redis else "embedded"
    status |= run(
        "bench.live_delay", "--jobs", "10" if args.quick else "30", "--modes", modes, env={"DATABASE_URL": "", "REDIS_URL": rd}
    )
    status |= run("bench.comfy_throughput", "--jobs", "8" if args.quick else "30", env={"DATABASE_URL": "", "REDIS_URL": ""})
    if has_pg and has_redis:
        status |= run("bench.idle_slots", "--jobs", "40" if args.quick else "80", "--database-url", pg, "--redis-url", rd)
    return status


if __name__ == "__main__":
    sys.exit(main())
