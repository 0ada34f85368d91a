"""Idle slot-seconds while work waited, in a mixed-fault run (issue 16).

    python -m bench.idle_slots [--jobs N] [--seed S] [--against REF]

On PostgreSQL (its own database, `--database` on the server of DATABASE_URL) and Redis
(REDIS_URL), two qclusters and the queue service run jobs of known duration on three
providers of different limits at the chaos fake (tests/fakes/chaos_provider.py, OpenAI
images, sync): it answers some creates 429 with Retry-After and some 503. At seeded
moments one worker process, one whole qcluster and the queue service are SIGKILLed; the
cluster and the service are restarted as bench/chaos.py does, the worker process is
respawned by its cluster.

The fake's exact call intervals say when a slot was busy. A trigger in the run's database
logs every change of a job's status and `not_before` with the database's clock (the same
host clock as the fake's), so for every moment the harness knows, per provider, the jobs
pending, the ones among them past their backoff, and the jobs the engine held slots for.
Work is *ready* when a job is pending, past its backoff, and the provider is outside every
Retry-After window it asked for. Per provider:

- busy slot-seconds (calls in flight at the fake);
- idle slot-seconds while work was ready: ∫ min(limit - calls in flight, ready jobs) dt;
- idle slot-seconds inside Retry-After windows and while every pending job was in backoff
  (reported apart: the provider or the retry policy asked for them);
- idle gaps (at least one slot idle while ready work waited) over 1 s, each with what the
  engine held then and the disruption before it;
- wall time against the ideal: the work the provider did (every call's duration) ÷ its
  limit, plus the Retry-After time it asked for. The run's wall time is against the
  bottleneck provider's ideal; goal ≤ 1.10×.

`--against REF` runs the same seeded run first on a git worktree of REF (with this file,
bench/runner.py, tests/procs.py and the fake copied in, so both runs are measured the same
way) and prints each figure with that run's value beside it:
`bench.idle_slots[pg+redis] <name> <value> <unit> (before <value>)`.
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

from bench import runner

ROOT = runner.ROOT
LABEL = "pg+redis"
HOST = socket.gethostname()
PROMPT = "chaos-job-{n} a lighthouse at dusk, oil on canvas"
RETRY_AFTER = 2.0
GAP_REPORTED = 1.0

# Name, concurrency, seconds of work per call, share of the jobs, create faults.
PROVIDERS = [
    ("wide", 3, 1.0, 0.45, {"429": 0.03, "5xx": 0.05}),
    ("pair", 2, 1.5, 0.35, {"429": 0.04, "5xx": 0.05}),
    ("single", 1, 0.8, 0.20, {"429": 0.03, "5xx": 0.05}),
]
# Files the run needs, copied over an older worktree for --against.
OVERLAY = ["bench/__init__.py", "bench/idle_slots.py", "bench/runner.py", "tests/procs.py", "tests/fakes/chaos_provider.py"]

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


# --- interval arithmetic (pure; tests/test_bench_idle_slots.py) -------------------------


def union_length(intervals, start=float("-inf"), end=float("inf")) -> float:
    """Seconds covered by at least one interval, inside [start, end]."""
    total, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def job_states(rows, until: float) -> tuple[list, list, list, list]:
    """From one job's log rows (at, status, not_before, lease owner) in order: its pending
    intervals, the parts of them past the backoff (`not_before`), its processing intervals
    (a slot held in the engine), and the parts of those before a worker took the claim
    (no lease owner yet), each ending at the next row or `until`."""
    pending, ready, held, claimed = [], [], [], []
    for (at, status, not_before, owner), following in zip(rows, [*rows[1:], None], strict=True):
        end = following[0] if following else until
        if end <= at:
            continue
        if status == "pending":
            pending.append((at, end))
            begin = max(at, not_before or at)
            if begin < end:
                ready.append((begin, end))
        elif status == "processing":
            held.append((at, end))
            if not owner:
                claimed.append((at, end))
    return pending, ready, held, claimed


def segments(start: float, end: float, layers: dict) -> list[tuple[float, float, dict]]:
    """Cut [start, end] at every interval edge of every layer; for each piece, how many
    intervals of each layer cover it."""
    edges = {start, end}
    deltas: dict[str, list] = {}
    for name, intervals in layers.items():
        events = []
        for a, b in intervals:
            a, b = max(a, start), min(b, end)
            if b > a:
                edges.update((a, b))
                events += [(a, 1), (b, -1)]
        deltas[name] = sorted(events)
    cuts = sorted(edges)
    counts = {name: 0 for name in layers}
    cursor = {name: 0 for name in layers}
    pieces = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        for name, events in deltas.items():
            i = cursor[name]
            while i < len(events) and events[i][0] <= a:
                counts[name] += events[i][1]
                i += 1
            cursor[name] = i
        pieces.append((a, b, dict(counts)))
    return pieces


def runs(pieces, predicate) -> list[tuple[float, float, list]]:
    """Maximal stretches of consecutive pieces for which predicate(counts) holds."""
    found, current = [], None
    for a, b, counts in pieces:
        if predicate(counts):
            if current and current[1] == a:
                current = (current[0], b, current[2] + [(a, b, counts)])
            else:
                if current:
                    found.append(current)
                current = (a, b, [(a, b, counts)])
        elif current:
            found.append(current)
            current = None
    if current:
        found.append(current)
    return found


def idle_figures(limit: int, start: float, end: float, *, calls, pending, ready, held, retry, claimed=()) -> dict:
    """Per provider, from intervals on one clock: busy and idle slot-seconds and the idle
    gaps. `ready` are pending jobs past their backoff; `retry` the Retry-After windows the
    provider asked for (no work is ready inside them); `held` the slots the engine held,
    `claimed` those of them no worker had taken yet."""
    layers = dict(calls=calls, pending=pending, ready=ready, held=held, retry=retry, claimed=claimed)
    pieces = segments(start, end, layers)
    busy = idle_ready = idle_retry = idle_backoff = 0.0
    for a, b, c in pieces:
        free = max(0, limit - c["calls"])
        span = b - a
        busy += min(limit, c["calls"]) * span
        waiting = min(free, c["pending"])
        if not waiting:
            continue
        if c["retry"]:
            idle_retry += waiting * span
            continue
        usable = min(free, c["ready"])
        idle_ready += usable * span
        idle_backoff += (waiting - usable) * span

    def ready_idle(c):
        return not c["retry"] and min(limit - c["calls"], c["ready"]) > 0

    gaps = []
    for a, b, inside in runs(pieces, ready_idle):
        # What the engine did meanwhile: every slot held (a lease or a claim without a
        # call: a dead owner, a hand-off not yet taken, a slow release) or a slot free in
        # the engine while ready work waited (nothing dispatched it).
        held_full = sum(y - x for x, y, c in inside if c["held"] >= limit)
        # A gap that opens as a Retry-After window closes is dispatch waiting for a
        # cool-down's end it was not woken for.
        closed = [stop for _, stop in retry if stop <= a + 0.05]
        gaps.append(
            dict(
                start=a,
                end=b,
                seconds=b - a,
                slot_seconds=sum((y - x) * min(limit - c["calls"], c["ready"]) for x, y, c in inside),
                all_held_seconds=held_full,
                untaken_claim_seconds=sum(y - x for x, y, c in inside if c["held"] >= limit and c["claimed"]),
                free_in_engine_seconds=(b - a) - held_full,
                ready_max=max(c["ready"] for _, _, c in inside),
                after_retry_after=a - max(closed) if closed and a - max(closed) < 0.5 else None,
            )
        )
    gaps.sort(key=lambda gap: gap["seconds"], reverse=True)
    return dict(
        busy_slot_seconds=busy,
        idle_ready_slot_seconds=idle_ready,
        idle_retry_after_slot_seconds=idle_retry,
        idle_backoff_slot_seconds=idle_backoff,
        gaps=gaps,
    )


def ideal_seconds(limit: int, calls, retry) -> float:
    """The work the provider did ÷ its limit, plus the Retry-After time it asked for."""
    return sum(b - a for a, b in calls) / limit + union_length(retry)


def explain(gap: dict, disruptions: list[tuple[float, str]], within: float = 30.0) -> str:
    """A gap's likely cause in words: for how long the engine held every slot (leases and
    claims without a call: a dead owner, a hand-off not taken, a slow release) and for how
    long a slot was free in the engine while ready work waited (nothing dispatched it), and
    the last disruption before it."""
    parts = []
    if gap["all_held_seconds"] > 0:
        held = f"every slot held in the engine without a call {gap['all_held_seconds']:.2f} s"
        untaken = gap.get("untaken_claim_seconds", 0.0)
        if untaken:
            held += f" ({untaken:.2f} s with a claim no worker had taken)"
        parts.append(held)
    if gap["free_in_engine_seconds"] > 0:
        parts.append(f"a slot free in the engine while ready work waited (no dispatch) {gap['free_in_engine_seconds']:.2f} s")
    state = ", ".join(parts)
    if gap.get("after_retry_after") is not None:
        state += f"; opened {gap['after_retry_after']:.2f} s after a Retry-After window ended"
    before = [(at, what) for at, what in disruptions if at <= gap["end"] and gap["start"] - at <= within]
    if before:
        at, what = before[-1]
        state += f"; {gap['start'] - at:+.1f} s after {what}" if at <= gap["start"] else f"; {what} inside it"
    return state


# --- the run ------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--against", default="", help="git ref to run the same seeded run on first, printed beside")
    parser.add_argument("--database-url", default=os.getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--redis-url", default=os.getenv("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--database", default=os.getenv("IDLE_SLOTS_DATABASE", "rs_idle_slots"))
    parser.add_argument("--cluster-name", default="rs_idle_slots")
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

        shutil.rmtree(self.var, ignore_errors=True)
        self.var.mkdir(parents=True)
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
        for proc in getattr(self, "procs", {}).values():
            try:
                proc.stop(timeout=30)
            except Exception:
                proc.kill()
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
            pending, ready, held, claimed = [], [], [], []
            last = self.started
            for job_id, rows in by_job.items():
                if project_of.get(job_id) != p["project"].id:
                    continue
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
                p["limit"],
                self.started,
                end,
                calls=calls,
                pending=pending,
                ready=ready,
                held=held,
                retry=retry,
                claimed=claimed,
            )
            ideal = ideal_seconds(p["limit"], worked, retry)
            outcomes: dict = {}
            for row in creates:
                outcomes[row["outcome"]] = outcomes.get(row["outcome"], 0) + 1
            gaps = [
                dict(gap, start=gap["start"] - self.started, end=gap["end"] - self.started, why=explain(gap, self.disruptions))
                for gap in figures.pop("gaps")
            ]
            out["providers"][p["name"]] = dict(
                figures,
                limit=p["limit"],
                seconds=p["seconds"],
                jobs=p["jobs"],
                wall=last - self.started,
                ideal=ideal,
                nominal=p["jobs"] * p["seconds"] / p["limit"],
                retry_after_seconds=union_length(retry),
                outcomes=outcomes,
                gaps=gaps,
            )
        bottleneck = max(out["providers"].values(), key=lambda f: f["ideal"])
        out["ideal"] = bottleneck["ideal"]
        return out


def lines(now: dict, before: dict | None) -> list[str]:
    """One line per figure, the run against REF beside it."""

    def pick(data, path):
        for part in path:
            if data is None:
                return None
            data = data.get(part)
        return data

    rows = []

    def add(name, path, unit, fmt="{:.1f}", note=""):
        value = pick(now, path)
        old = pick(before, path) if before else None
        parts = []
        if before is not None:
            parts.append("before " + ("n/a" if old is None else fmt.format(old)))
        if note:
            parts.append(note)
        text = f"bench.idle_slots[{LABEL}] {name} {fmt.format(value)} {unit}"
        rows.append(text + (f" ({'; '.join(parts)})" if parts else ""))

    for name in now["providers"]:
        p = now["providers"][name]
        tag = f"{name}(limit {p['limit']}, {p['seconds']} s jobs)"
        add(f"busy.{name}", ("providers", name, "busy_slot_seconds"), "slot-s", note=tag)
        add(f"idle_while_ready.{name}", ("providers", name, "idle_ready_slot_seconds"), "slot-s", note="goal: turnover only")
        add(f"idle_in_retry_after.{name}", ("providers", name, "idle_retry_after_slot_seconds"), "slot-s", note="asked for")
        add(f"idle_all_in_backoff.{name}", ("providers", name, "idle_backoff_slot_seconds"), "slot-s", note="reported")
        for which in (now, before):
            if which is not None:
                gaps = which["providers"][name]["gaps"]
                which["providers"][name]["gaps_over_1s"] = sum(1 for g in gaps if g["seconds"] > GAP_REPORTED)
                which["providers"][name]["longest_gap"] = max((g["seconds"] for g in gaps), default=0.0)
        add(f"unexplained_gaps_over_1s.{name}", ("providers", name, "gaps_over_1s"), "gaps", "{:d}", note="goal 0")
        add(f"longest_unexplained_gap.{name}", ("providers", name, "longest_gap"), "s", "{:.2f}")
        for which in (now, before):
            if which is not None:
                f = which["providers"][name]
                f["ratio"] = f["wall"] / f["ideal"] if f["ideal"] else 0.0
        add(f"wall.{name}", ("providers", name, "wall"), "s", note=f"ideal {p['ideal']:.1f} s")
        add(f"wall_over_ideal.{name}", ("providers", name, "ratio"), "x", "{:.3f}")
    for which in (now, before):
        if which is not None:
            which["ratio"] = which["wall"] / which["ideal"]
    add("wall", ("wall",), "s", note=f"ideal {now['ideal']:.1f} s (bottleneck provider)")
    add("wall_over_ideal", ("ratio",), "x", "{:.3f}", note="goal ≤ 1.10")
    return rows


def details(data: dict, title: str) -> list[str]:
    out = [f"# {title}: seed {data['seed']}, {data['jobs']} jobs, started {data.get('started', '?')} (+0 s in the logs)"]
    for at, what in data["disruptions"]:
        out.append(f"#   +{at:.1f} s {what}")
    for name, p in data["providers"].items():
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(p["outcomes"].items()))
        out.append(
            f"#   {name}: {p['jobs']} jobs, creates {outcomes}; Retry-After asked {p['retry_after_seconds']:.1f} s; "
            f"nominal {p['nominal']:.1f} s"
        )
        for gap in [g for g in p["gaps"] if g["seconds"] > GAP_REPORTED][:8]:
            out.append(
                f"#     gap +{gap['start']:.2f}→+{gap['end']:.2f} s ({gap['seconds']:.2f} s, {gap['slot_seconds']:.2f} slot-s, "
                f"{gap['ready_max']} ready): {gap['why']}"
            )
    return out


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
    command = [
        sys.executable,
        "-m",
        "bench.idle_slots",
        "--jobs",
        str(args.jobs),
        "--seed",
        str(args.seed),
        "--database-url",
        args.database_url,
        "--redis-url",
        args.redis_url,
        "--database",
        f"{args.database}_before",
        "--cluster-name",
        f"{args.cluster_name}_before",
        "--workers",
        str(args.workers),
        "--json",
        str(result),
        "--label",
        f"before-{sha}",
    ]
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
    for text in details(data, "this run"):
        print(text)
    if before is not None:
        for text in details(before, f"before ({before['ref']})"):
            print(text)
    for text in lines(data, before):
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
