"""End-to-end delay from a job's completion in a worker to the browser showing it.

Real processes — daphne, qcluster, the queue service — and Debian's Chromium through
Playwright, on a fresh database, in both modes:
- embedded: SQLite, django-q2's ORM broker, the in-memory channel layer (daphne relays
  the event rows written by the worker processes);
- redis: REDIS_URL for the broker and channels-redis (and DATABASE_URL if set).

The page records, for each job, the browser's clock when the job's chip turned
"completed" (from the WebSocket event); the delay is that minus the job's finished_at,
written by the worker in the transaction that completes the job (one machine, one clock).

    .venv/bin/python -m bench.live_delay [--jobs 30] [--modes embedded,redis]

One line per figure (bench/figures.py).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.figures import emit  # noqa: E402
from bench.runner import prefixed  # noqa: E402

GOAL_MS = 1000.0
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def run_mode(mode: str, jobs: int) -> None:
    """Runs in a child process whose environment selects the mode."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "remixstudio.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    from queue_app.models import AccountSettings, Job, Provider, Status
    from tests import procs
    from tests.conftest import make_project

    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    running = []
    try:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_user("bench", password="pw-bench")
        AccountSettings.objects.create(user=user)
        provider = Provider.objects.create(owner=user, name="Demo", family="demo", concurrency=4, options={"latency_ms": 300})
        project = make_project(user, provider, name="Live delay")
        Job.objects.bulk_create([Job(project=project, owner=user, prompt=f"fox {i}") for i in range(jobs)])
        logs = Path(settings.VAR_DIR) / "logs"
        env = {"REDIS_URL": settings.REDIS_URL}
        running += [procs.qcluster(logs, workers=4, **env), procs.queue_service(logs, **env)]
        web = procs.daphne(logs, **env)
        running.append(web)
        seen = watch_in_browser(web.url, project.id, jobs)
        finished = {
            str(i): f.timestamp() * 1000 for i, f in Job.objects.filter(status=Status.COMPLETED).values_list("id", "finished_at")
        }
        report([seen[job_id]["at"] - at for job_id, at in finished.items()], mode, connection.vendor)
    finally:
        for proc in running:
            proc.stop()
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)


def watch_in_browser(url: str, project_id, jobs: int) -> dict:
    """Log in, open the project, start every job and wait until the page saw each complete:
    per job id, what the page recorded (`at`: the browser's clock when its chip turned)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(120_000)
        page.goto(f"{url}/accounts/login/")
        page.fill("input[name=username]", "bench")
        page.fill("input[name=password]", "pw-bench")
        page.click("main button[type=submit]")
        page.wait_for_url(f"{url}/projects/")
        page.goto(f"{url}/projects/{project_id}/")
        page.wait_for_selector("body[data-live='1']")
        page.click("#start-all")
        page.wait_for_function(
            f"Object.values(window.__liveSeen).filter(s => s.status === 'completed').length === {jobs}", timeout=180_000
        )
        seen = page.evaluate("window.__liveSeen")
        browser.close()
    return seen


def report(delays: list[float], mode: str, vendor: str) -> None:
    label = f"{mode}_{vendor}"
    stack = f"{vendor}+{'redis' if mode == 'redis' else 'orm'}"
    p50, p95, worst = statistics.median(delays), sorted(delays)[int(0.95 * (len(delays) - 1))], max(delays)
    goal = f"< {GOAL_MS:.0f} ms"
    emit(f"live_delay_{label}_p50", f"{p50:.0f}", "ms", f"{len(delays)} jobs", stack=stack, goal=goal, met=p50 < GOAL_MS)
    emit(f"live_delay_{label}_p95", f"{p95:.0f}", "ms", stack=stack, goal=goal, met=p95 < GOAL_MS)
    print(f"# load average (1 min) {os.getloadavg()[0]:.2f} processes ({os.cpu_count()} cpus)")
    emit(f"live_delay_{label}_max", f"{worst:.0f}", "ms", f"min {min(delays):.0f} ms", stack=stack)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--modes", default="embedded,redis")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_mode(args.one, args.jobs)
        return
    tmp = Path(tempfile.mkdtemp(prefix="live-delay-"))
    for mode in args.modes.split(","):
        env = dict(os.environ, VAR_DIR=str(tmp / mode), MEDIA_ROOT=str(tmp / mode / "media"), LOG_LEVEL="WARNING")
        env.setdefault("Q_CLUSTER_NAME", f"livedelay{os.getpid()}")
        env.setdefault("CHANNELS_PREFIX", f"livedelay{os.getpid()}")
        if mode == "embedded":
            env.pop("REDIS_URL", None)
            env.pop("DATABASE_URL", None)
            env["TEST_DB_NAME"] = str(tmp / "embedded.sqlite3")
        else:
            env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/3")
            env["TEST_DB_NAME"] = prefixed("bench_live_mon") if env.get("DATABASE_URL") else str(tmp / "redis.sqlite3")
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "bench.live_delay", "--one", mode, "--jobs", str(args.jobs)], cwd=ROOT, env=env
        )
        if result.returncode:
            print(f"live_delay_{mode} failed (exit {result.returncode}) after {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
