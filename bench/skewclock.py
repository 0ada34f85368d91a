"""A process tree whose wall clock runs ahead or behind the rest of the machine's.

The fake is bench/skewclock.c, an LD_PRELOAD shim built here with the system's C compiler:
it shifts CLOCK_REALTIME and nothing else, as on a host whose clock is wrong. Debian's
libfaketime (0.9.10) fakes CLOCK_MONOTONIC too and does not intercept sem_clockwait,
which CPython 3.11 uses for every timed lock acquisition: in a process under it,
`threading.Event.wait(timeout)` never returns before its event is set. A worker's
LeaseKeeper (which waits LEASE_RENEW_SECONDS between renewals) then never renews, and
any job running longer than the lease is rightly healed by the queue service: an
"early heal" that a real skewed host would not have. And with
FAKETIME_DONT_FAKE_MONOTONIC=1 the same libfaketime makes `time.sleep` fail with EINVAL.
"""

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("skewclock.c")


def build(into: Path) -> Path:
    """The shim, compiled into `into` (again when the source is newer)."""
    into.mkdir(parents=True, exist_ok=True)
    library = into / "skewclock.so"
    if not library.exists() or library.stat().st_mtime < SOURCE.stat().st_mtime:
        built = into / f"skewclock.{os.getpid()}.so"
        _ensure_compiler()
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(built), str(SOURCE), "-ldl"], check=True)
        built.replace(library)
    return library


def _ensure_compiler() -> None:
    """Debian's gcc, installed with apt-get when missing and we are root; otherwise say how."""
    if shutil.which("cc"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        apt = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=apt)
        subprocess.run(["apt-get", "install", "-y", "-qq", "gcc", "libc6-dev"], check=True, env=apt)
        return
    raise RuntimeError("the clock-skew fake needs a C compiler: sudo apt-get install gcc")


def env(library: Path, seconds: int) -> dict:
    """The environment that puts a process (and its children) `seconds` ahead."""
    return {"LD_PRELOAD": str(library), "SKEW_CLOCK_SECONDS": str(int(seconds))}
