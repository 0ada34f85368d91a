"""The chaos run: real processes, a faulty fake provider, kills — and the books checked.

    python -m bench.chaos --jobs 200 [--seed N] [--ci]

On its own database (PostgreSQL `rs_chaos`, after BENCH_DB_PREFIX, on the server of
DATABASE_URL; SQLite under var/chaos without it) and, with REDIS_URL, its own broker
cluster: a fake provider with injected faults, four provider records at it, two qclusters
and the queue service. While the jobs run, a cluster or the queue service is SIGKILLed and
restarted every few seconds; once, a cluster gets a SIGTERM and the app's connections are
terminated. The books (bench/chaos_books.py) then print one line per figure and assert: no
job lost, no duplicate album item, no call over a provider's limit, no slot leaked, kill →
dispatchable p100 < 15 s, Retry-After kept, no unexplained paid submission, no secret or
prompt in the logs. Exit status 1 when any fails. More in docs/testing.md.
"""

import argparse
import os
import random
import shutil
import socket
import sys
import time

from bench import runner
from bench.chaos_books import Books

ROOT = runner.ROOT
PROMPT = "chaos-job-{n} a lighthouse at dusk, oil on canvas"
HOST = socket.gethostname()

# Every fault the fake can inject into a create, at the rates of the two most faulty records.
EVERY_CREATE_FAULT = {
    "5xx": 0.05,
    "429": 0.03,
    "reset_before": 0.03,
    "reset_after": 0.02,
    "slow_body": 0.03,
    "malformed": 0.02,
    "hang": 0.01,
}
# Name, family, concurrency, options on the record, behaviour of the fake.
PROVIDERS = [
    (
        "replicate-async",
        "replicate",
        3,
        {},
        dict(
            latency=(0.5, 2.0),
            create_faults=EVERY_CREATE_FAULT,
            poll_faults={"5xx": 0.05, "reset_before": 0.03, "malformed": 0.03, "slow_body": 0.02},
            task_fail_rate=0.05,
            task_never_rate=0.02,
        ),
    ),
    (
        "replicate-wait",
        "replicate",
        1,
        {"wait_seconds": 3},
        dict(
            latency=(0.2, 1.0),
            create_faults={"5xx": 0.04, "429": 0.04, "reset_after": 0.02, "slow_body": 0.03},
            poll_faults={"5xx": 0.05, "malformed": 0.03},
            task_fail_rate=0.03,
        ),
    ),
    (
        "openai-sync",
        "openai",
        2,
        {},
        dict(
            latency=(0.2, 1.0),
            create_faults=EVERY_CREATE_FAULT,
        ),
    ),
    (
        "openai-wide",
        "openai",
        4,
        {},
        dict(latency=(0.1, 0.6), create_faults={"5xx": 0.04, "429": 0.02, "reset_before": 0.02, "slow_body": 0.02}),
    ),
]
MODELS = {"replicate": "black-forest-labs/flux-schnell", "openai": "gpt-image-1"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--ci", action="store_true", help="reduced run for CI (the default size, tighter timeouts)")
    parser.add_argument(
        "--database", default=os.getenv("CHAOS_DATABASE", runner.prefixed("rs_chaos")), help="database name to (re)create"
    )
    parser.add_argument("--database-url", default=os.getenv("DATABASE_URL", ""), help="server (PostgreSQL) or empty for SQLite")
    parser.add_argument("--redis-url", default=os.getenv("REDIS_URL", ""))
    parser.add_argument("--cluster-name", default=os.getenv("CHAOS_CLUSTER_NAME", runner.prefixed("rs_chaos")))
    parser.add_argument("--workers", type=int, default=3, help="worker processes per qcluster")
    parser.add_argument("--kill-every", type=float, nargs=2, default=(3.0, 6.0), metavar=("MIN", "MAX"))
    parser.add_argument("--drain-timeout", type=float, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the var/chaos directory (logs, media)")
    return parser.parse_args(argv)


class Chaos(Books):
    def __init__(self, args):
        self.args = args
        self.seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
        self.rng = random.Random(self.seed)
        self.var = ROOT / "var" / "chaos"
        self.logs = self.var / "logs"
        self.sentinel = f"sk-SENTINEL-{random.Random(self.seed).getrandbits(64):016x}"
        self.kills: list[dict] = []
        self.disruptions: list[float] = []  # wall times of kills and pg_terminate_backend
        self.graceful_stop_seconds = None
        self.events: list[str] = []
        self.started_wall = time.time()
        self.failures: list[str] = []
        self.other_disruptions = "; plus 1 SIGTERM and 1 pg_terminate_backend"

    # --- setup ---------------------------------------------------------------------

    def make_fake(self):
        """The fake provider, started (a subclass may bind it elsewhere)."""
        from tests.fakes.chaos_provider import ChaosProvider

        return ChaosProvider(seed=self.seed).start()

    def setup(self):
        runner.fresh_dir(self.var)
        if self.args.database_url:
            url = runner.with_database(self.args.database_url, self.args.database)
        else:
            url = f"sqlite:///{self.var / 'chaos.sqlite3'}"
        self.fake = self.make_fake()
        self.stack = runner.Stack(
            database_url=url,
            redis_url=self.args.redis_url,
            cluster_name=self.args.cluster_name,
            var_dir=self.var,
            extra=runner.chaos_env(
                fake_port=self.fake.port, workers=self.args.workers, secret="chaos-run", DETACHED_POLL_SECONDS=2
            ),
        )
        self.stack.prepare()
        import logging

        logging.getLogger("django-q").setLevel(logging.WARNING)
        from django.contrib.auth import get_user_model

        from queue_app.models import AccountSettings, Job, Project, Provider

        user = get_user_model().objects.create_user(username="chaos", password="chaos-pw-not-used")
        AccountSettings.objects.create(user=user, storage_limit_bytes=50 * 1024**3)
        self.user = user
        self.providers = []
        for index, (name, family, concurrency, options, behaviour) in enumerate(PROVIDERS):
            key = f"{self.sentinel}-{index}"
            self.fake.configure(key, family=family, **behaviour)
            provider = Provider(
                owner=user,
                name=name,
                family=family,
                base_url=f"{self.fake.url}/v1",
                options=options,
                concurrency=concurrency,
                max_attempts=6,
            )
            provider.api_key = key
            provider.save()
            project = Project.objects.create(
                owner=user, name=f"chaos {name}", kind="image", provider=provider, model=MODELS[family]
            )
            self.providers.append((provider, project, key))
        jobs = []
        for n in range(self.args.jobs):
            provider, project, _ = self.providers[n % len(self.providers)]
            jobs.append(Job(project=project, owner=user, prompt=PROMPT.format(n=n)))
        Job.objects.bulk_create(jobs, batch_size=500)
        self.job_by_token = {str(n): job.id for n, job in enumerate(jobs)}

    def start_processes(self):
        self.procs = {
            "worker-a": runner.manage(self.stack, "worker-a", "qcluster", log_dir=self.logs),
            "worker-b": runner.manage(self.stack, "worker-b", "qcluster", log_dir=self.logs),
            "queue": runner.manage(self.stack, "queue", "queue_service", log_dir=self.logs),
        }

    # --- the run -------------------------------------------------------------------

    def start_jobs(self):
        from queue_app.services.jobs import jobs_start

        for _, project, _ in self.providers:
            jobs_start(user=self.user, project=project, all_drafts=True)

    def terminal_count(self) -> int:
        from queue_app.models import Job, Status

        return Job.objects.filter(owner=self.user, status__in=[Status.COMPLETED, Status.FAILED]).count()

    def running_under(self, proc) -> dict:
        """Jobs a process was executing (lease owner one of its pids), and claimed jobs no
        worker had taken yet (lease owner empty), with their lease tokens."""
        from queue_app.models import Job, Status

        owners = [f"{HOST}:{pid}" for pid in proc.pids()]
        running = dict(
            Job.objects.filter(status=Status.PROCESSING, task_id="", lease_owner__in=owners).values_list("id", "lease_token")
        )
        claimed = dict(Job.objects.filter(status=Status.PROCESSING, task_id="", lease_owner="").values_list("id", "lease_token"))
        return {"running": running, "claimed": claimed}

    def kill(self, name: str, *, graceful: bool = False):
        proc = self.procs[name]
        affected = self.running_under(proc) if name.startswith("worker") else {"running": {}, "claimed": {}}
        at, stamp = time.monotonic(), self.stamp()
        if graceful:
            proc.stop(timeout=60)
            self.graceful_stop_seconds = time.monotonic() - at
        else:
            proc.kill()
        self.kills.append(dict(name=name, at=at, graceful=graceful, pending=dict(affected), recovered={}))
        self.disruptions.append(time.time())
        self.events.append(f"{stamp} {'SIGTERM' if graceful else 'SIGKILL'} {name}")
        time.sleep(self.rng.uniform(0.3, 1.5))
        proc.start()

    def terminate_backends(self):
        from django.db import connection

        if connection.vendor != "postgresql":
            self.events.append("pg_terminate_backend skipped (SQLite)")
            return 0
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            count = cursor.fetchone()[0]
        self.disruptions.append(time.time())
        self.events.append(f"{self.stamp()} pg_terminate_backend: {count} connection(s)")
        return count

    def stamp(self) -> str:
        """Wall clock and seconds into the run (the scale `explain_submissions` prints)."""
        return f"{time.strftime('%H:%M:%S')} (+{time.time() - self.started_wall:.3f} s)"

    def track_recoveries(self):
        """For every kill: when each affected job became dispatchable again (left the dead
        lease: healed to pending, re-claimed, or finished)."""
        from queue_app.models import Job

        now = time.monotonic()
        for kill in self.kills:
            for kind in ("running", "claimed"):
                waiting = {
                    job_id: token for job_id, token in kill["pending"][kind].items() if (kind, job_id) not in kill["recovered"]
                }
                if not waiting:
                    continue
                rows = dict(Job.objects.filter(id__in=list(waiting)).values_list("id", "lease_token"))
                for job_id, token in waiting.items():
                    if rows.get(job_id) != token:
                        kill["recovered"][(kind, job_id)] = now - kill["at"]

    def run(self):
        total = self.args.jobs
        started = time.monotonic()
        self.started_wall = time.time()
        chaos_until = 0.85
        next_kill = started + self.rng.uniform(*self.args.kill_every)
        sigterm_at = 0.35
        terminate_at = 0.55
        did_sigterm = did_terminate = False
        drain_timeout = self.args.drain_timeout or (240 if self.args.ci else max(300, total * 0.6))
        self.start_jobs()
        deadline = started + drain_timeout
        while True:
            from django.db import close_old_connections

            close_old_connections()
            try:
                done = self.terminal_count()
                self.track_recoveries()
            except Exception as error:  # our own connection was terminated too
                self.events.append(f"harness query failed once: {type(error).__name__}")
                from django.db import connection

                connection.close()
                time.sleep(0.2)
                continue
            progress = done / total
            now = time.monotonic()
            if done >= total and self.all_recovered():
                break
            if now > deadline:
                self.failures.append(f"drain timeout: {done}/{total} jobs finished after {drain_timeout:.0f} s")
                break
            if progress < chaos_until:
                if not did_sigterm and progress >= sigterm_at:
                    did_sigterm = True
                    self.kill(self.rng.choice(["worker-a", "worker-b"]), graceful=True)
                elif not did_terminate and progress >= terminate_at:
                    did_terminate = True
                    self.terminate_backends()
                elif now >= next_kill:
                    self.kill(self.rng.choice(["worker-a", "worker-b", "worker-a", "worker-b", "queue"]))
                    next_kill = time.monotonic() + self.rng.uniform(*self.args.kill_every)
            time.sleep(0.1)
        if not did_terminate:
            self.terminate_backends()
        self.elapsed = time.monotonic() - started
        time.sleep(1)

    def all_recovered(self) -> bool:
        return all(len(k["recovered"]) >= len(k["pending"]["running"]) + len(k["pending"]["claimed"]) for k in self.kills)

    def stop(self):
        runner.stop_all(self.procs.values())


def main(argv=None) -> int:
    args = parse_args(argv)
    chaos = Chaos(args)
    sys.path.insert(0, str(ROOT))
    print(f"# chaos run: {args.jobs} jobs, seed {chaos.seed}", flush=True)
    chaos.setup()
    try:
        chaos.start_processes()
        chaos.run()
    finally:
        chaos.stop()
        chaos.fake_stop = chaos.fake.stop()
    chaos.report()
    if chaos.failures:
        runner.print_failures("CHAOS", chaos.failures)
        print(f"logs: {chaos.logs}")
        return 1
    print("chaos: all assertions hold")
    if not args.keep and not chaos.failures:
        shutil.rmtree(chaos.var / "media", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
