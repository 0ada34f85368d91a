"""Install the virtualenv `make` uses, fast: `python scripts/install.py [--dev]`.

A cold `make run` spent most of its time in pip fetching one project page after another.
Here the pinned runtime set (requirements.lock, `make lock` writes it) is installed by
several pip processes side by side, each with its own share and no dependency resolution
(--no-deps), wheels preferred and no bytecode compiled ahead (Python writes it on first
import, for what is imported). When the lock was written from another requirements.txt
(its hash says) or a share failed, one ordinary `pip install -r` follows and adds what
the lock missed: a stale lock costs time, never correctness. `--dev` adds the test and tooling packages (requirements-dev.txt).
pip itself is not upgraded; the interpreter's own pip installs into the venv when it can
(`pip --python`, pip 22.3+), so the venv is made without one (ensurepip costs seconds).
Standard library only: it runs before the venv exists.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PARALLEL = 4
LOCK_OF = "# pins requirements.txt sha256 "
QUIET = ["-q", "--disable-pip-version-check", "--prefer-binary", "--no-compile"]


def host_pip_targets_other_pythons() -> bool:
    """Whether this interpreter's pip can install into another environment (--python)."""
    done = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True)
    if done.returncode != 0:
        return False
    version = done.stdout.split()[1].split(".")
    return (int(version[0]), int(version[1])) >= (22, 3)


def make_venv() -> list[str]:
    """The venv (made when missing) and the pip command that installs into it."""
    python = VENV / "bin" / "python"
    outside = host_pip_targets_other_pythons()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", *(["--without-pip"] if outside else []), str(VENV)], check=True)
    if (VENV / "bin" / "pip").exists() or not outside:
        return [str(python), "-m", "pip"]
    return [sys.executable, "-m", "pip", "--python", str(python)]


def pinned(lock: Path) -> list[str]:
    if not lock.exists():
        return []
    lines = (line.split("#")[0].strip() for line in lock.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def lock_is_current(lock: Path, requirements: Path) -> bool:
    """Whether the lock was written from this requirements.txt (`make lock` notes its hash)."""
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    return lock.exists() and f"{LOCK_OF}{digest}" in lock.read_text()


def install_in_parallel(pip: list[str], packages: list[str]) -> bool:
    """Each share by its own pip process, at once; a share that fails is left to the final
    pass (which says why if it fails too)."""
    shares = [packages[i::PARALLEL] for i in range(PARALLEL) if packages[i::PARALLEL]]
    procs = [
        subprocess.Popen([*pip, "install", *QUIET, "--no-deps", *share], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for share in shares
    ]
    failed = sum(proc.wait() != 0 for proc in procs)
    if failed:
        print(f"install: {failed} of {len(procs)} parallel shares failed; the final pass installs what is missing")
    return not failed


def main() -> None:
    parser = argparse.ArgumentParser(description="Install .venv: the runtime packages, and with --dev the test tools.")
    parser.add_argument("--dev", action="store_true", help="also requirements-dev.txt (tests, lint, benchmarks)")
    args = parser.parse_args()
    began = time.monotonic()
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    pip = make_venv()
    lock, runtime = ROOT / "requirements.lock", ROOT / "requirements.txt"
    complete = install_in_parallel(pip, pinned(lock)) and bool(pinned(lock))
    if args.dev or not (complete and lock_is_current(lock, runtime)):
        requirements = ROOT / "requirements-dev.txt" if args.dev else runtime
        subprocess.run([*pip, "install", *QUIET, "-r", str(requirements)], check=True)
    print(f"install: ready in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
