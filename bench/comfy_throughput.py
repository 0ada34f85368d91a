"""ComfyUI runner throughput against the fake ComfyUI: 1 s prompts, 2 MB outputs.

Real processes (qcluster + queue_service) on a fresh SQLite database (or DATABASE_URL).
Prints one line per figure (bench/figures.py), both ways side by side: with the WebSocket
accelerator (`[ws+poll]`, the default) and with the 2 s polling alone (`[poll-only]`).

    .venv/bin/python -m bench.comfy_throughput [--jobs 30] [--seconds 1.0] [--mb 2]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TMP = Path(tempfile.mkdtemp(prefix="comfy-bench-"))
os.environ.setdefault("VAR_DIR", str(TMP))
os.environ.setdefault("MEDIA_ROOT", str(TMP / "media"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "remixstudio.settings")
os.environ["OUTBOUND_ALLOWLIST"] = "http://127.0.0.1"  # plain http to the loopback fake only
os.environ.setdefault("LOG_LEVEL", "WARNING")
os.environ.setdefault("Q_CLUSTER_NAME", f"comfybench{os.getpid()}")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from bench.figures import emit  # noqa: E402
from queue_app.services.jobs import jobs_start  # noqa: E402
from tests.fakes.comfyui import WORKFLOW, FakeComfyUI, Script  # noqa: E402
from tests.procs import Proc  # noqa: E402

IDLE_GOAL_MS = 50.0
LIMIT = 2  # prompts in flight at one instance


def child_env(**extra) -> dict:
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", **{k: str(v) for k, v in extra.items()})
    return env


def run_once(*, jobs: int, seconds: float, megabytes: float, websocket: bool) -> dict:
    from django.contrib.auth import get_user_model

    from comfy_app.models import ComfyInstance
    from queue_app.models import AccountSettings, Job, Project, Status

    user = get_user_model().objects.create_user(f"bench{time.monotonic_ns()}", password="x")
    AccountSettings.objects.create(user=user, storage_limit_bytes=50 * 1024**3)
    project = Project.objects.create(owner=user, name="bench", kind="comfyui")
    fake = FakeComfyUI().start()
    fake.default = Script(seconds=seconds, image_bytes=int(megabytes * 1024 * 1024))
    ComfyInstance.objects.create(project=project, base_url=fake.url, workflow=WORKFLOW)
    Job.objects.bulk_create([Job(project=project, owner=user, prompt=f"bench {i}") for i in range(jobs)])
    env = child_env(COMFY_WEBSOCKET="1" if websocket else "0", QUEUE_WORKERS=4)
    logs = TMP / "logs"
    logs.mkdir(exist_ok=True)
    manage = [sys.executable, str(ROOT / "manage.py")]
    cluster = Proc("qcluster", manage + ["qcluster"], env, logs)
    service = Proc("queue_service", manage + ["queue_service"], env, logs)
    try:
        time.sleep(2)  # let both processes boot before the clock starts
        started = time.monotonic()
        jobs_start(user=user, project=project, all_drafts=True)
        deadline = started + jobs * seconds * 4 + 120
        while Job.objects.filter(project=project, status=Status.COMPLETED).count() < jobs:
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out; see {logs}")
            if Job.objects.filter(project=project, status=Status.FAILED).exists():
                raise SystemExit("a job failed: " + Job.objects.filter(project=project, status=Status.FAILED)[0].error)
            time.sleep(0.05)
        finished = time.monotonic()
    finally:
        cluster.stop()
        service.stop()
        fake.stop()
    runs = sorted(fake.runs, key=lambda run: run["started"])
    gaps = [(b["started"] - a["ended"]) * 1000 for a, b in zip(runs, runs[1:], strict=False)]
    return {
        "idle_median_ms": statistics.median(gaps),
        "idle_p90_ms": sorted(gaps)[int(len(gaps) * 0.9)],
        "jobs_per_min": jobs / (finished - started) * 60,
        "ideal_per_min": 60 / seconds,
        "max_in_flight": fake.max_in_flight,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--mb", type=float, default=2.0)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    for websocket in (True, False):
        mode = "ws+poll" if websocket else "poll-only"
        r = run_once(jobs=args.jobs, seconds=args.seconds, megabytes=args.mb, websocket=websocket)
        idle = r["idle_median_ms"]
        goal = f"< {IDLE_GOAL_MS:.0f} ms"
        emit("comfy_idle_between_prompts_median", f"{idle:.1f}", "ms", stack=mode, goal=goal, met=idle < IDLE_GOAL_MS)
        emit("comfy_idle_between_prompts_p90", f"{r['idle_p90_ms']:.1f}", "ms", stack=mode)
        share = f"{r['jobs_per_min'] / r['ideal_per_min']:.0%} of ideal {r['ideal_per_min']:.0f}"
        emit("comfy_jobs_per_minute", f"{r['jobs_per_min']:.1f}", "jobs/min", share, stack=mode)
        peak = r["max_in_flight"]
        emit("comfy_max_in_flight", peak, "prompts", stack=mode, goal=f"≤ {LIMIT}, the instance's limit", met=peak <= LIMIT)


if __name__ == "__main__":
    main()
