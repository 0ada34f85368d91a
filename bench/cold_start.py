"""`make run` from a cold clone: seconds from the command to the first page, then again
for a second start of the same clone (its virtualenv and database kept).

    python -m bench.cold_start [--source .] [--keep]

The clone is `git clone` of `--source` (its committed HEAD) into a temporary directory;
`make run` starts there with no DATABASE_URL or REDIS_URL (the embedded set-up), on a
free port; the first page is the sign-in page answering 200. Each start is stopped with
Ctrl-C (SIGINT to `make`'s process group), as a person would. What pip downloads is
whatever this machine's pip configuration (cache, wheelhouse, index) offers.
"""

import argparse
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import figures

FIRST_GOAL, SECOND_GOAL = 60.0, 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start(clone: Path, port: int, log: Path, limit: float) -> tuple[float, float]:
    """(seconds from `make run` to the first page, CPU seconds the whole start took, stop
    included); the stack is stopped before returning."""
    cpu = cpu_of_children()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "VIRTUAL_ENV", "DEBUG")}
    env.update(PORT=str(port), PYTHONUNBUFFERED="1")
    began = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not answers(f"http://127.0.0.1:{port}/accounts/login/"):
            if proc.poll() is not None:
                raise SystemExit(f"make run exited with {proc.returncode}; see {log}")
            if time.monotonic() - began > limit:
                raise SystemExit(f"no page after {limit:.0f} s; see {log}")
            time.sleep(0.2)
        first_page = time.monotonic() - began
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return first_page, cpu_of_children() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    parser.add_argument("--limit", type=float, default=600.0, help="give up after this many seconds per start")
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix="rs_cold_"))
    clone = where / "clone"
    try:
        subprocess.run(["git", "clone", "-q", args.source, str(clone)], check=True)
        log = where / "make_run.log"
        for name, what, goal in (("first", "make run from a fresh clone", FIRST_GOAL), ("second", "make run again", SECOND_GOAL)):
            load = os.getloadavg()[0]
            seconds, cpu = start(clone, free_port(), log, args.limit)
            note = f"{what}; {cpu:.0f} CPU s in all; load average {load:.1f} on {os.cpu_count()} cores"
            figures.emit(f"cold_start_{name}_page", f"{seconds:.1f}", "s", note, goal=f"< {goal:.0f} s", met=seconds < goal)
        print(f"# log: {log}" if args.keep else "", file=sys.stderr)
    finally:
        if args.keep:
            print(f"# clone kept at {clone}", file=sys.stderr)
        else:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
