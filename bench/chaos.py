"""The chaos run: real processes, a faulty fake provider, kills — and the books checked.

    python -m bench.chaos --jobs 200 [--seed N] [--ci]

Against its own database (PostgreSQL `rs_chaos` on the server of DATABASE_URL, migrated
here; SQLite `var/chaos/chaos.sqlite3` without DATABASE_URL) and, with REDIS_URL, the
Redis broker under its own cluster name. It starts a local fake provider server speaking
Replicate (async) and OpenAI images (sync) with injected faults (tests/fakes/chaos_provider.py),
four provider records of different concurrency and modes pointing at it, two qcluster
processes and the queue service. While the jobs run, every few seconds a random worker
cluster or the queue service is SIGKILLed and restarted; once per run a cluster gets a
SIGTERM (graceful stop) and the app's database connections are terminated
(`pg_terminate_backend`, PostgreSQL only).

Then it prints, one line per figure (`chaos.<name> <value> <unit> (<comparison>)`), and
asserts: jobs lost 0 (every started job ends completed, or failed with a reason),
duplicate album items 0, concurrency violations 0 (at the fake, per provider record,
from exact intervals), slots leaked after drain 0, kill → dispatchable again p100 < 15 s,
Retry-After violations 0, no extra remote submission without a cause (a kill, an
ambiguous answer, a remote failure — counted and shown), the sentinel API key nowhere in
logs, stored errors or events, and no prompt in the logs. Exit status 1 when any fails.
"""

import argparse
import json
import os
import random
import re
import shutil
import socket
import sys
import time
from collections import Counter

from bench import runner

ROOT = runner.ROOT
PROMPT = "chaos-job-{n} a lighthouse at dusk, oil on canvas"
PROMPT_WORDS = "a lighthouse at dusk, oil on canvas"
HOST = socket.gethostname()

# Name, family, concurrency, options on the record, behaviour of the fake.
PROVIDERS = [
    (
        "replicate-async",
        "replicate",
        3,
        {},
        dict(
            latency=(0.5, 2.0),
            create_faults={
                "5xx": 0.05,
                "429": 0.03,
                "reset_before": 0.03,
                "reset_after": 0.02,
                "slow_body": 0.03,
                "malformed": 0.02,
                "hang": 0.01,
            },
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
            create_faults={
                "5xx": 0.05,
                "429": 0.03,
                "reset_before": 0.03,
                "reset_after": 0.02,
                "slow_body": 0.03,
                "malformed": 0.02,
                "hang": 0.01,
            },
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
    parser.add_argument("--database", default=os.getenv("CHAOS_DATABASE", "rs_chaos"), help="database name to (re)create")
    parser.add_argument("--database-url", default=os.getenv("DATABASE_URL", ""), help="server (PostgreSQL) or empty for SQLite")
    parser.add_argument("--redis-url", default=os.getenv("REDIS_URL", ""))
    parser.add_argument("--cluster-name", default=os.getenv("CHAOS_CLUSTER_NAME", "rs_chaos"))
    parser.add_argument("--workers", type=int, default=3, help="worker processes per qcluster")
    parser.add_argument("--kill-every", type=float, nargs=2, default=(3.0, 6.0), metavar=("MIN", "MAX"))
    parser.add_argument("--drain-timeout", type=float, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the var/chaos directory (logs, media)")
    return parser.parse_args(argv)


def line(name: str, value, unit: str = "", comparison: str = "") -> None:
    text = f"chaos.{name} {value}"
    if unit:
        text += f" {unit}"
    if comparison:
        text += f" ({comparison})"
    print(text, flush=True)


class Chaos:
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
        if self.var.exists():
            shutil.rmtree(self.var)
        self.var.mkdir(parents=True)
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
        for proc in self.procs.values():
            try:
                proc.stop(timeout=30)
            except Exception:
                proc.kill()

    # --- the books -----------------------------------------------------------------

    def check(self, name: str, ok: bool, detail: str):
        if not ok:
            self.failures.append(f"{name}: {detail}")

    def report(self):
        from django.db import close_old_connections
        from django.db.models import Count

        from queue_app.models import AlbumItem, Job, JobAttempt, ProjectEvent, Status

        close_old_connections()
        jobs = Job.objects.filter(owner=self.user)
        by_status = Counter(jobs.values_list("status", flat=True))
        line("seed", self.seed)
        line("jobs", self.args.jobs)
        line("wall_time", f"{self.elapsed:.1f}", "s")
        line("database", "postgresql" if self.stack.database_url.startswith("postgres") else "sqlite")
        line("broker", "redis" if self.stack.redis_url else "orm")
        for event in self.events:
            print(f"# {event}")
        line("completed", by_status.get(Status.COMPLETED, 0), "jobs")
        line("failed", by_status.get(Status.FAILED, 0), "jobs")
        reasons = Counter(
            (error.split(":")[0][:60] if error else "(no reason)")
            for error in jobs.filter(status=Status.FAILED).values_list("error", flat=True)
        )
        for reason, count in reasons.most_common(6):
            print(f"#   failed: {count} × {reason}")

        lost = (
            jobs.exclude(status__in=[Status.COMPLETED, Status.FAILED]).count()
            + jobs.filter(status=Status.FAILED, error="").count()
        )
        line("jobs_lost", lost, "jobs", "must be 0")
        self.check("jobs lost", lost == 0, f"{lost} job(s) neither completed nor failed with a reason")

        per_output = AlbumItem.objects.filter(owner=self.user).values("job_id", "output_index").annotate(n=Count("id"))
        duplicates = sum(row["n"] - 1 for row in per_output if row["n"] > 1)
        completed_without = jobs.filter(status=Status.COMPLETED).exclude(album_items__isnull=False).count()
        extra_items = sum(
            max(0, row["n"] - 1) for row in AlbumItem.objects.filter(owner=self.user).values("job_id").annotate(n=Count("id"))
        )
        line("duplicate_album_items", duplicates + extra_items, "items", "must be 0")
        line("completed_without_album_item", completed_without, "jobs", "must be 0")
        self.check("duplicate album items", duplicates + extra_items == 0, f"{duplicates + extra_items}")
        self.check("completed without item", completed_without == 0, f"{completed_without}")

        violations = 0
        closest_lines = []
        for provider, _, key in self.providers:
            peak = self.fake.peak_inflight(key)
            over = max(0, peak - provider.concurrency)
            violations += over
            line(f"peak_inflight.{provider.name}", peak, "calls", f"concurrency {provider.concurrency}")
            for crowd in self.fake.crowds(key, above=provider.concurrency)[:3]:
                self.explain_crowd(provider, crowd)
            closest = self.fake.closest_handover(key, provider.concurrency)
            if closest is not None:
                closest_lines.append(f"{provider.name} {closest * 1000:.0f} ms")
        line("concurrency_violations", violations, "calls over the limit", "must be 0")
        line(
            "closest_handover",
            ", ".join(closest_lines) or "none",
            "",
            "reported: a call that took the last free slot started this long after the call before it ended",
        )
        self.check("concurrency", violations == 0, f"{violations} call(s) over a provider's limit")

        leaked = jobs.filter(status=Status.PROCESSING).count() + Job.objects.filter(slot__isnull=False).count()
        line("slots_leaked_after_drain", leaked, "slots", "must be 0")
        self.check("slots leaked", leaked == 0, f"{leaked}")

        # A SIGTERM lets the worker finish what it runs: its jobs are not interrupted, so
        # they are reported on their own, not as recoveries.
        running_times = [
            t for k in self.kills if not k["graceful"] for (kind, _), t in k["recovered"].items() if kind == "running"
        ]
        graceful_times = [t for k in self.kills if k["graceful"] for (kind, _), t in k["recovered"].items() if kind == "running"]
        claimed_times = [
            t for k in self.kills if not k["graceful"] for (kind, _), t in k["recovered"].items() if kind == "claimed"
        ]
        kills = [k for k in self.kills if not k["graceful"]]
        line(
            "kills",
            len(kills),
            "SIGKILL",
            f"workers {sum(k['name'] != 'queue' for k in kills)}, queue service "
            f"{sum(k['name'] == 'queue' for k in kills)}{self.other_disruptions}",
        )
        line(
            "kill_to_dispatchable_p100",
            f"{max(running_times, default=0):.2f}",
            "s",
            f"goal < 15 s; {len(running_times)} running jobs interrupted",
        )
        line("kill_to_dispatchable_p50", f"{percentile(running_times, 50):.2f}", "s")
        line(
            "claimed_job_taken_p100",
            f"{max(claimed_times, default=0):.2f}",
            "s",
            f"jobs claimed but not yet taken by any worker at a kill, until a worker or healing took them; "
            f"{len(claimed_times)} jobs; CLAIM_TTL_SECONDS=10",
        )
        if self.graceful_stop_seconds is not None:
            line("sigterm_worker_exit", f"{self.graceful_stop_seconds:.2f}", "s", "SIGTERM to the exit of a qcluster (reported)")
        line(
            "sigterm_running_jobs_finished_p100",
            f"{max(graceful_times, default=0):.2f}",
            "s",
            f"graceful stop: {len(graceful_times)} running jobs finished by the stopping worker",
        )
        for kill in (k for k in self.kills if not k["graceful"]):
            slowest = max(((t, job_id) for (kind, job_id), t in kill["recovered"].items() if kind == "running"), default=None)
            if slowest and slowest[0] >= 10:
                print(
                    f"#   slow recovery after {'SIGTERM' if kill['graceful'] else 'SIGKILL'} {kill['name']}: job {slowest[1]} "
                    f"{slowest[0]:.1f} s"
                )
        self.check("kill to dispatchable", max(running_times, default=0) < 15, f"p100 {max(running_times, default=0):.1f} s")
        unrecovered = sum(len(k["pending"]["running"]) + len(k["pending"]["claimed"]) - len(k["recovered"]) for k in self.kills)
        self.check("recovered", unrecovered == 0, f"{unrecovered} interrupted job(s) never became dispatchable")

        retry_violations = 0
        known = self.rate_limit_known()
        for provider, _, key in self.providers:
            found = self.fake.retry_after_violations(key, known=known)
            retry_violations += len(found)
            if found:
                print(f"#   Retry-After: {len(found)} create(s) of {provider.name} inside a window")
                t0 = self.started_wall
                for row in found:
                    print(f"#     create of chaos-job-{row['job']} started +{row['start'] - t0:.3f} s ({row['outcome']})")
                for row in self.fake.entries(key, "create"):
                    if row["outcome"] == "429":
                        seen = known(row)
                        print(
                            f"#     429 to chaos-job-{row['job']} sent +{row['end'] - t0:.3f} s, recorded "
                            f"{'never' if seen is None else f'+{seen - t0:.3f} s'}, window until "
                            f"+{row['end'] + row['retry_after'] - t0:.3f} s"
                        )
        sent_429 = sum(self.fake.create_outcomes(key).get("429", 0) for _, _, key in self.providers)
        in_flight = sum(len(self.fake.creates_in_flight_at_429(key, known=known)) for _, _, key in self.providers)
        all_429 = [row for row in self.fake.entries(kind="create") if row["outcome"] == "429"]
        lost_429 = sum(1 for row in all_429 if known(row) is None)
        line("retry_after_violations", retry_violations, "requests", f"must be 0; {sent_429} 429s sent")
        line(
            "rate_limits_lost_to_a_kill",
            lost_429,
            "429s",
            "reported: its worker was killed or lost its database before recording it",
        )
        line(
            "creates_in_flight_at_a_429",
            in_flight,
            "requests",
            "reported: sent by another worker before the 429's cool-down was recorded, or within 0.25 s of it",
        )
        self.check("Retry-After", retry_violations == 0, f"{retry_violations} create(s) inside a Retry-After window")

        self.submissions(jobs)
        self.secrets(jobs)

        outcomes = Counter()
        for _, _, key in self.providers:
            outcomes.update(self.fake.create_outcomes(key))
        print("# fake create outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        attempts = Counter(JobAttempt.objects.filter(job__owner=self.user).values_list("outcome", flat=True))
        print("# attempt outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(attempts.items())))
        line(
            "attempts_left_running",
            attempts.get("running", 0),
            "attempt rows",
            "reported: attempts whose worker died before healing recorded them",
        )
        orphans = sum(self.fake.orphans(key) for _, _, key in self.providers if self.fake.records[key].family == "replicate")
        line(
            "orphan_remote_tasks", orphans, "tasks", "created, never polled: ambiguous creates and kills before the id was stored"
        )
        events = ProjectEvent.objects.filter(project__owner=self.user).count()
        line("live_events", events, "rows")

    def rate_limit_known(self):
        """For a 429 the fake sent: when the queue knew of it. The worker that got it sets
        the provider's cool-down and then closes its attempt as rate_limited, so that
        attempt's end bounds the moment other workers' pre-submit checks could see it.
        Without such an attempt: None when a kill or a backend termination hit within
        2 s (the queue never learned of that 429; counted apart), else the moment it was
        sent (strict)."""
        from queue_app.models import JobAttempt

        closed = {}
        rows = JobAttempt.objects.filter(job__owner=self.user, outcome=JobAttempt.Outcome.RATE_LIMITED)
        for job_id, started, finished in rows.values_list("job_id", "started_at", "finished_at"):
            if finished is not None:
                closed.setdefault(str(job_id), []).append((started.timestamp(), finished.timestamp()))

        def known(row) -> float | None:
            job_id = str(self.job_by_token.get(row["job"]))
            ends = [finished for started, finished in closed.get(job_id, []) if started <= row["end"] <= finished]
            if ends:
                return max(row["end"], ends[0])
            if any(row["end"] - 0.5 <= at <= row["end"] + 2.0 for at in self.disruptions):
                return None
            return row["end"]

        return known

    def submissions(self, jobs):
        from queue_app.models import JobAttempt

        counts = self.fake.submissions_per_job()
        at_fake = self.fake.resubmission_causes()
        causes = Counter()
        for attempt_job, outcome, reason in JobAttempt.objects.filter(job__owner=self.user).values_list(
            "job_id", "outcome", "reason"
        ):
            if self.resubmission_cause(outcome, reason):
                causes[str(attempt_job)] += 1
        histogram = Counter(counts.values())
        extra = unexplained = by_kill = 0
        for token, k in counts.items():
            if k <= 1:
                continue
            job_id = str(self.job_by_token.get(token))
            allowed = at_fake.get(token, 0) + causes[job_id]
            extra += k - 1
            by_kill += min(k - 1, causes[job_id])
            if k - 1 > allowed:
                unexplained += (k - 1) - allowed
                self.explain_submissions(token, job_id)
        line(
            "submissions_per_job",
            " ".join(f"{n}×{c}" for n, c in sorted(histogram.items())),
            "",
            "accepted remote submissions: count×jobs",
        )
        line(
            "extra_submissions",
            extra,
            "submissions",
            f"{by_kill} after a kill/ambiguous attempt, rest after an ambiguous answer or a failed remote task",
        )
        line("unexplained_extra_submissions", unexplained, "submissions", "must be 0")
        self.check("submissions", unexplained == 0, f"{unexplained} extra submission(s) without a cause")

    def resubmission_cause(self, outcome: str, reason: str) -> bool:
        """An attempt that explains one more paid submission of its job (the fault runs of
        bench/chaos_faults.py add theirs)."""
        return outcome in ("interrupted", "lost", "ambiguous")

    def explain_crowd(self, provider, crowd):
        """Print the calls that were in flight together over a provider's limit, and what the
        database recorded of their jobs (attempts: worker, times, outcome, reason)."""
        t0 = self.started_wall
        print(f"#   over the limit of {provider.name} ({provider.concurrency}): {len(crowd)} calls in flight")
        for span in sorted(crowd, key=lambda span: span["start"]):
            job_id = self.job_by_token.get(span["job"])
            print(
                f"#     call of chaos-job-{span['job']} {span['start'] - t0:8.3f}→{span['end'] - t0:8.3f} s "
                f"{span['outcome']} {span['task']}"
            )
            self.print_attempts(job_id, indent="#       ")

    def explain_submissions(self, token, job_id):
        """Print what the fake and the database saw of a job with unexplained submissions,
        so a red run can be read without re-running it."""
        t0 = self.started_wall
        print(f"#   unexplained: job {job_id} (chaos-job-{token})")
        for row in self.fake.entries(kind="create"):
            if row.get("job") == token:
                print(
                    f"#     create {row['start'] - t0:8.3f}→{row.get('end', row['start']) - t0:8.3f} s"
                    f" outcome={row['outcome']} worked={row.get('worked')} prediction={row.get('prediction', '')}"
                )
        self.print_attempts(job_id, indent="#     ")

    def print_attempts(self, job_id, *, indent: str):
        """A job's attempts as the database recorded them, on the run's time scale."""
        from queue_app.models import JobAttempt

        t0 = self.started_wall
        for attempt in JobAttempt.objects.filter(job_id=job_id).order_by("id"):
            started = attempt.started_at.timestamp() - t0
            finished = attempt.finished_at.timestamp() - t0 if attempt.finished_at else float("nan")
            print(
                f"{indent}attempt {attempt.number} {started:8.3f}→{finished:8.3f} s {attempt.outcome} "
                f"worker={attempt.worker} task={attempt.task_id} reason={attempt.reason[:160]!r}"
            )

    def secrets(self, jobs):
        from queue_app.models import JobAttempt, ProjectEvent

        texts = {name: proc.log() for name, proc in self.procs.items()}
        in_logs = sum(text.count(self.sentinel) for text in texts.values())
        stored = (
            jobs.filter(error__contains=self.sentinel).count()
            + JobAttempt.objects.filter(reason__contains=self.sentinel).count()
            + sum(
                self.sentinel in json.dumps(payload)
                for payload in ProjectEvent.objects.filter(project__owner=self.user).values_list("payload", flat=True)
            )
        )
        line("sentinel_key_in_logs", in_logs, "occurrences", "must be 0")
        line("sentinel_key_stored", stored, "rows", "must be 0")
        self.check("sentinel key", in_logs + stored == 0, f"{in_logs} in logs, {stored} stored")
        prompts = sum(len(re.findall(re.escape(PROMPT_WORDS), text)) for text in texts.values())
        line("prompts_in_logs", prompts, "occurrences", "must be 0")
        self.check("prompts in logs", prompts == 0, f"{prompts}")
        tracebacks = sum(text.count("Traceback") for text in texts.values())
        line("tracebacks_in_logs", tracebacks, "", "reported")


def percentile(values, p):
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


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
        print("CHAOS FAILED:")
        for failure in chaos.failures:
            print("  - " + failure)
        print(f"logs: {chaos.logs}")
        return 1
    print("chaos: all assertions hold")
    if not args.keep and not chaos.failures:
        shutil.rmtree(chaos.var / "media", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
