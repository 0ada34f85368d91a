"""Idle slot-seconds while work waited, in a mixed-fault run (issue 16).

    python -m bench.idle_slots [--jobs N] [--seed S] [--against REF]

On PostgreSQL (its own database) and Redis, two qclusters and the queue service run jobs of
known duration on three providers of different limits at the chaos fake, which answers
some creates 429 with Retry-After and some 503; a worker process, a cluster and the queue
service are SIGKILLed at seeded moments. The fake's call intervals say when a slot was
busy; a trigger logs every change of a job's status and backoff on the database's clock.
Per provider: busy slot-seconds, idle slot-seconds while ready work waited (and apart:
inside Retry-After windows, all in backoff), idle gaps over 1 s with their likely cause,
and wall time against the ideal (goal ≤ 1.10×). `--against REF`: the same run on REF first,
its figures beside. Arithmetic: bench/idle_intervals.py; figures: bench/idle_report.py.
"""

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench import idle_report, runner
from bench.idle_intervals import explain, ideal_seconds, idle_figures, job_states, union_length

ROOT = runner.ROOT
HOST = socket.gethostname()
PROMPT = "chaos-job-{n} a lighthouse at dusk, oil on canvas"
RETRY_AFTER = 2.0

# Name, concurrency, seconds of work per call, share of the jobs, create faults.
PROVIDERS = [
    ("wide", 3, 1.0, 0.45, {"429": 0.03, "5xx": 0.05}),
    ("pair", 2, 1.5, 0.35, {"429": 0.04, "5xx": 0.05}),
    ("single", 1, 0.8, 0.20, {"429": 0.03, "5xx": 0.05}),
]
# Files the run needs, copied over an older worktree for --against.
OVERLAY = [
    "bench/__init__.py",
    "bench/figures.py",
    "bench/idle_intervals.py",
    "bench/idle_report.py",
    "bench/idle_slots.py",
    "bench/runner.py",
    "tests/procs.py",
    "tests/fakes/chaos_provider.py",
]

JOB_LOG_SQL = """
CREATE TABLE bench_job_log (
    id bigserial PRIMARY KEY, job_id uuid NOT NULL, at double precision NOT NULL,
    status text NOT NULL, not_before double precision, lease_owner text
);
CREATE FUNCTION bench_job_log_row() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status
            OR NEW.not_before IS DISTINCT FROM OLD.not_before OR NEW.lease_token IS DISTINCT FROM OLD.lease_token
            OR NEW.lease_owner IS DISTINCT FROM OLD.lease_owner THEN
        INSERT INTO bench_job_log (job_id, at, status, not_before, lease_owner)
        VALUES (NEW.id, extract(epoch FROM clock_timestamp()), NEW.status,
                extract(epoch FROM NEW.not_before), NEW.lease_owner);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER bench_job_log AFTER INSERT OR UPDATE ON queue_app_job
    FOR EACH ROW EXECUTE FUNCTION bench_job_log_row();
"""


# --- the run ------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--against", default="", help="git ref to run the same seeded run on first, printed beside")
    parser.add_argument("--database-url", default=os.getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--redis-url", default=os.getenv("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--database", default=os.getenv("IDLE_SLOTS_DATABASE", runner.prefixed("rs_idle_slots")))
    parser.add_argument("--cluster-name", default=runner.prefixed("rs_idle_slots"))
    parser.add_argument("--workers", type=int, default=6, help="worker processes per qcluster (one cluster fills every slot)")
    parser.add_argument("--json", default="", help="write the figures here (used by --against)")
    parser.add_argument("--label", default="", help="var/idle_slots/<label> for logs")
    return parser.parse_args(argv)


class Run:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.var = ROOT / "var" / "idle_slots" / (args.label or "run")
        self.logs = self.var / "logs"
        self.disruptions: list[tuple[float, str]] = []

    def setup(self):
        from tests.fakes.chaos_provider import ChaosProvider

        runner.fresh_dir(self.var)
        self.fake = ChaosProvider(seed=self.args.seed).start()
        self.stack = runner.Stack(
            database_url=runner.with_database(self.args.database_url, self.args.database),
            redis_url=self.args.redis_url,
            cluster_name=self.args.cluster_name,
            var_dir=self.var,
            # bench/chaos.py's cadences, so a couple of minutes hold many cycles.
            extra=runner.chaos_env(fake_port=self.fake.port, workers=self.args.workers, secret="idle-slots"),
        )
        self.stack.prepare()
        import logging

        logging.getLogger("django-q").setLevel(logging.WARNING)
        from django.contrib.auth import get_user_model
        from django.db import connection

        from queue_app.models import AccountSettings, Job, Project, Provider

        with connection.cursor() as cursor:
            cursor.execute(JOB_LOG_SQL)
        user = get_user_model().objects.create_user(username="idle", password="idle-pw-not-used")
        AccountSettings.objects.create(user=user, storage_limit_bytes=50 * 1024**3)
        self.user = user
        self.providers = []
        counts = [round(self.args.jobs * share) for _, _, _, share, _ in PROVIDERS]
        counts[0] += self.args.jobs - sum(counts)
        n = 0
        for index, ((name, limit, seconds, _, faults), count) in enumerate(zip(PROVIDERS, counts, strict=True)):
            key = f"sk-idle-{self.args.seed}-{index}"
            self.fake.configure(key, family="openai", latency=(seconds, seconds), create_faults=faults, retry_after=RETRY_AFTER)
            provider = Provider(
                owner=user,
                name=name,
                family="openai",
                base_url=f"{self.fake.url}/v1",
                concurrency=limit,
                max_attempts=8,
            )
            provider.api_key = key
            provider.save()
            project = Project.objects.create(owner=user, name=name, kind="image", provider=provider, model="gpt-image-1")
            Job.objects.bulk_create([Job(project=project, owner=user, prompt=PROMPT.format(n=n + i)) for i in range(count)])
            n += count
            self.providers.append(
                dict(name=name, id=provider.id, key=key, limit=limit, seconds=seconds, jobs=count, project=project)
            )

    def start_processes(self):
        from queue_app.models import Heartbeat

        self.procs = {
            "cluster-a": runner.manage(self.stack, "cluster-a", "qcluster", log_dir=self.logs),
            "cluster-b": runner.manage(self.stack, "cluster-b", "qcluster", log_dir=self.logs),
            "queue": runner.manage(self.stack, "queue", "queue_service", log_dir=self.logs),
        }
        # Idle time before the workers are up is start-up, not the engine's.
        runner.wait_for(lambda: Heartbeat.objects.filter(role="worker").count() >= 2, timeout=120, message="two worker clusters")
        runner.wait_for(
            lambda: all(len(proc.pids()) > self.args.workers for name, proc in self.procs.items() if name != "queue"),
            timeout=60,
            message="worker processes",
        )
        time.sleep(2)

    def expected_seconds(self) -> float:
        return max(p["jobs"] * p["seconds"] / p["limit"] for p in self.providers)

    def schedule(self) -> list[tuple[float, str, str]]:
        """Seeded moments (seconds after start) of the three kills."""
        span = self.expected_seconds()
        return [
            (self.rng.uniform(0.15, 0.30) * span, "worker", self.rng.choice(["cluster-a", "cluster-b"])),
            (self.rng.uniform(0.40, 0.55) * span, "cluster", self.rng.choice(["cluster-a", "cluster-b"])),
            (self.rng.uniform(0.65, 0.80) * span, "queue", "queue"),
        ]

    def kill_worker_process(self, cluster: str) -> str:
        """SIGKILL one worker process of a cluster, preferring one inside a provider call."""
        import signal

        from queue_app.models import Job

        proc = self.procs[cluster]
        children = proc.pids()[1:]
        owners = set(Job.objects.filter(status="processing").values_list("lease_owner", flat=True))
        inside = [pid for pid in children if f"{HOST}:{pid}" in owners]
        pool = inside or children
        if not pool:
            return f"no worker process of {cluster} to kill"
        pid = self.rng.choice(sorted(pool))
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL worker process {pid} of {cluster}{' (inside a call)' if inside else ''}"

    def kill_and_restart(self, name: str) -> str:
        proc = self.procs[name]
        proc.kill()
        time.sleep(self.rng.uniform(0.3, 1.5))
        proc.start()
        return f"SIGKILL {name}"

    def run(self):
        from django.db import close_old_connections

        from queue_app.models import Job
        from queue_app.services.jobs import jobs_start

        plan = self.schedule()
        self.started = time.time()
        for p in self.providers:
            jobs_start(user=self.user, project=p["project"], all_drafts=True)
        deadline = self.started + max(300, self.expected_seconds() * 6)
        while True:
            close_old_connections()
            now = time.time()
            while plan and now - self.started >= plan[0][0]:
                _, kind, target = plan.pop(0)
                at = time.time()
                what = self.kill_worker_process(target) if kind == "worker" else self.kill_and_restart(target)
                self.disruptions.append((at, what))
            left = Job.objects.filter(owner=self.user).exclude(status__in=["completed", "failed"]).count()
            if left == 0 and not plan:
                break
            if now > deadline:
                raise SystemExit(f"idle_slots: {left} jobs unfinished after {now - self.started:.0f} s (logs: {self.logs})")
            time.sleep(0.1)
        self.finished = time.time()
        time.sleep(0.5)

    def stop(self):
        runner.stop_all(getattr(self, "procs", {}).values())
        self.fake.stop()

    # --- the figures ----------------------------------------------------------------

    def figures(self) -> dict:
        from django.db import close_old_connections, connection

        from queue_app.models import Job

        close_old_connections()
        with connection.cursor() as cursor:
            cursor.execute("SELECT job_id, at, status, not_before, lease_owner FROM bench_job_log ORDER BY job_id, at, id")
            log_rows = cursor.fetchall()
        by_job: dict = {}
        for job_id, at, status, not_before, owner in log_rows:
            by_job.setdefault(job_id, []).append((at, status, not_before, owner))
        project_of = dict(Job.objects.filter(owner=self.user).values_list("id", "project_id"))
        end = self.finished
        out = dict(seed=self.args.seed, jobs=self.args.jobs, wall=end - self.started, providers={}, disruptions=[])
        out["started"] = time.strftime("%H:%M:%S", time.localtime(self.started)) + f".{int(self.started % 1 * 1000):03d}"
        out["disruptions"] = [(at - self.started, what) for at, what in self.disruptions]
        for p in self.providers:
            rows = {job_id: rows for job_id, rows in by_job.items() if project_of.get(job_id) == p["project"].id}
            out["providers"][p["name"]] = self.provider_figures(p, rows, end)
        bottleneck = max(out["providers"].values(), key=lambda f: f["ideal"])
        out["ideal"] = bottleneck["ideal"]
        return out

    def provider_figures(self, p: dict, by_job: dict, end: float) -> dict:
        """One provider's figures from its jobs' log rows and the fake's calls."""
        pending, ready, held, claimed = [], [], [], []
        last = self.started
        for rows in by_job.values():
            a, r, h, c = job_states(rows, end)
            pending += a
            ready += r
            held += h
            claimed += c
            terminal = [row[0] for row in rows if row[1] in ("completed", "failed")]
            last = max([last, *terminal])
        creates = [row for row in self.fake.entries(p["key"], "create") if "end" in row]
        calls = [(row["start"], row.get("sent") or row["end"]) for row in creates]
        worked = [(row["start"], row.get("sent") or row["end"]) for row in creates if row.get("worked")]
        retry = [(row["end"], row["end"] + row["retry_after"]) for row in creates if row["outcome"] == "429"]
        figures = idle_figures(
            p["limit"], self.started, end, calls=calls, pending=pending, ready=ready, held=held, retry=retry, claimed=claimed
        )
        outcomes: dict = {}
        for row in creates:
            outcomes[row["outcome"]] = outcomes.get(row["outcome"], 0) + 1
        gaps = [
            dict(gap, start=gap["start"] - self.started, end=gap["end"] - self.started, why=explain(gap, self.disruptions))
            for gap in figures.pop("gaps")
        ]
        return dict(
            figures,
            limit=p["limit"],
            seconds=p["seconds"],
            jobs=p["jobs"],
            wall=last - self.started,
            ideal=ideal_seconds(p["limit"], worked, retry),
            nominal=p["jobs"] * p["seconds"] / p["limit"],
            retry_after_seconds=union_length(retry),
            outcomes=outcomes,
            gaps=gaps,
        )


def against(args) -> dict:
    """The same seeded run on a worktree of `args.against`, with this run's measuring files."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", args.against], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = ROOT / "var" / "idle_slots" / f"tree-{sha}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True, capture_output=True)
    for path in OVERLAY:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, tree / path)
    result = tree / "idle_slots.json"
    result.unlink(missing_ok=True)
    options = {
        "--jobs": args.jobs,
        "--seed": args.seed,
        "--database-url": args.database_url,
        "--redis-url": args.redis_url,
        "--database": f"{args.database}_before",
        "--cluster-name": f"{args.cluster_name}_before",
        "--workers": args.workers,
        "--json": result,
        "--label": f"before-{sha}",
    }
    command = [sys.executable, "-m", "bench.idle_slots", *(str(part) for pair in options.items() for part in pair)]
    print(f"# before: {sha} in {tree}", flush=True)
    status = subprocess.run(command, cwd=tree, env=dict(os.environ)).returncode
    if status != 0 or not result.exists():
        raise SystemExit(f"idle_slots: the run on {sha} failed (status {status})")
    data = json.loads(result.read_text())
    data["ref"] = sha
    return data


def main(argv=None) -> int:
    args = parse_args(argv)
    before = against(args) if args.against else None
    print(f"# idle_slots: {args.jobs} jobs, seed {args.seed}, {args.workers} workers × 2 clusters", flush=True)
    run = Run(args)
    run.setup()
    try:
        run.start_processes()
        run.run()
    finally:
        run.stop()
    data = run.figures()
    if args.json:
        # A run for --against: the caller prints its figures beside its own.
        Path(args.json).write_text(json.dumps(data))
        return 0
    for text in idle_report.details(data, "this run"):
        print(text)
    if before is not None:
        for text in idle_report.details(before, f"before ({before['ref']})"):
            print(text)
    idle_report.emit_all(data, before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
