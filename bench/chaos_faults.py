"""Scenarios 4–7: the infrastructure fails under a running queue.

    python -m bench.chaos_faults [--scenario N] [--seed S] [--runs R] [--ci]

4. PostgreSQL restarts mid-run: every process reconnects on its own, none exits.
5. Redis restarts without persistence: the broker's queued tasks are gone; their jobs are
   reclaimed and complete; live events resume.
6. The media disk fills up: no partial album item, no half-written file; the jobs wait
   with the reason and complete once the filler is deleted.
7. One host's clock runs 60 s ahead (bench/skewclock.py): no early heal, no lease or claim
   stolen.

Each is bench/chaos.py's soak with one fault instead of the kills, its books plus the
scenario's (bench/fault_books.py), on private PostgreSQL and Redis servers
(bench/fault_infra.py), never the shared ones. Needs root, postgresql-15, redis-server and
a C compiler. More in docs/testing.md.
"""

import argparse
import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

from bench import chaos as soak
from bench import runner, skewclock
from bench.fault_books import DISK_FULL_WORDS, FaultBooks
from bench.fault_infra import PrivateInfra, ensure_tools

ROOT = runner.ROOT
VAR = ROOT / "var" / "chaos-faults"
CLOCK_AHEAD_SECONDS = 60
SCENARIOS = (4, 5, 6, 7)


def clock_ahead_env() -> dict:
    """Scenario 7's environment for worker-b and the queue service: their wall clock
    CLOCK_AHEAD_SECONDS ahead, their monotonic clock and timed waits untouched."""
    return skewclock.env(skewclock.build(ROOT / "var" / "skewclock"), CLOCK_AHEAD_SECONDS)


class FaultRun(FaultBooks, soak.Chaos):
    """One scenario: bench/chaos.py's run and books, one fault instead of the kills."""

    FAULT_AT = 0.3  # progress (finished jobs / all) at which the fault hits

    def __init__(self, args, scenario: int, infra: PrivateInfra):
        super().__init__(args)
        self.scenario, self.infra = scenario, infra
        self.var = VAR
        self.logs = VAR / "logs"
        self.faults: list[dict] = []  # {at, name, rows: {job_id: snapshot}, recovered: {job_id: seconds}}
        self.extra_checks: list[tuple[str, object, str, str]] = []
        self.mounted = False

    # --- processes -----------------------------------------------------------------

    def start_processes(self):
        if self.scenario == 6:
            self.mount_media()
        fast = clock_ahead_env() if self.scenario == 7 else {}
        self.procs = {
            "worker-a": runner.manage(self.stack, "worker-a", "qcluster", log_dir=self.logs),
            "worker-b": runner.manage(self.stack, "worker-b", "qcluster", log_dir=self.logs, **fast),
            "queue": runner.manage(self.stack, "queue", "queue_service", log_dir=self.logs, **fast),
        }
        self.main_pids = {name: proc.pid for name, proc in self.procs.items()}

    def mount_media(self):
        media = self.var / "media"
        media.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(media)], check=True)
        self.mounted = True

    def unmount_media(self):
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.var / "media")], check=False)
            self.mounted = False

    # --- the run -------------------------------------------------------------------

    def run(self):
        started = time.monotonic()
        self.started_wall = time.time()
        total = self.args.jobs
        deadline = started + (self.args.drain_timeout or (150 if self.args.ci else max(240, total * 1.2)))
        self.wait_ready()
        self.start_jobs()
        faulted = False
        while True:
            from django.db import close_old_connections, connection

            close_old_connections()
            try:
                done = self.terminal_count()
                self.track_faults()
                self.watch()
            except Exception as error:  # the database restarting under us too
                self.events.append(f"harness query failed: {type(error).__name__}")
                connection.close()
                time.sleep(0.3)
                continue
            if done >= total and all(len(f["recovered"]) >= len(f["rows"]) for f in self.faults):
                break
            if time.monotonic() > deadline:
                self.failures.append(f"drain timeout: {done}/{total} jobs finished")
                break
            if not faulted and done / total >= self.FAULT_AT:
                faulted = True
                self.fault()
            time.sleep(0.1)
        self.elapsed = time.monotonic() - started
        time.sleep(1)

    def wait_ready(self, timeout: float = 90):
        """Jobs start once both clusters take tasks and the queue service has done its
        start-up scan. On this loaded 2-core machine they took ~8 s to boot; claims made
        before then sat untaken until their 10 s ran out and were healed, which scenario 7
        counted as an early heal (seed 100, one run in twenty)."""
        ready = {"worker-a": "] running.", "worker-b": "] running.", "queue": "recovery scan:"}
        began = time.monotonic()
        runner.wait_for(
            lambda: all(words in self.procs[name].log() for name, words in ready.items()),
            timeout=timeout,
            interval=0.1,
            message="both clusters and the queue service to be up",
        )
        self.events.append(f"{self.stamp()} processes up after {time.monotonic() - began:.1f} s; jobs start")

    def affected(self) -> dict:
        """Every processing job as it stands: a job is dispatchable or running again once
        some live process changed it (healed, re-claimed, renewed, polled, finished)."""
        from queue_app.models import Job, Status

        fields = ("lease_token", "lease_expires_at", "poll_claimed_until", "next_poll_at", "status", "task_id")
        rows = Job.objects.filter(owner=self.user, status=Status.PROCESSING).values_list("id", *fields)
        return {row[0]: row[1:] for row in rows}

    def begin_fault(self, name: str, rows: dict | None = None) -> dict:
        fault = dict(name=name, at=time.monotonic(), rows=self.affected() if rows is None else rows, recovered={})
        self.faults.append(fault)
        self.events.append(f"{self.stamp()} {name}: {len(fault['rows'])} job(s) affected")
        return fault

    def track_faults(self):
        from queue_app.models import Job

        now = time.monotonic()
        fields = ("lease_token", "lease_expires_at", "poll_claimed_until", "next_poll_at", "status", "task_id")
        for fault in self.faults:
            waiting = [job_id for job_id in fault["rows"] if job_id not in fault["recovered"]]
            if not waiting or now < fault.get("track_from", 0):
                continue
            current = {row[0]: row[1:] for row in Job.objects.filter(id__in=waiting).values_list("id", *fields)}
            for job_id in waiting:
                if current.get(job_id) != fault["rows"][job_id]:
                    fault["recovered"][job_id] = now - fault["at"]

    def watch(self):
        """Scenario-specific checks while the run goes on (the disk's space coming back)."""
        if self.scenario == 6 and self.faults and "freed" not in self.faults[0]:
            fault = self.faults[0]
            if time.monotonic() >= fault["free_at"]:
                (self.var / "media" / "filler").unlink(missing_ok=True)
                fault["freed"] = time.monotonic()
                self.events.append(f"{self.stamp()} filler deleted: space is back")
                # From now on: when every job that hit the full disk is claimed again or done.
                from queue_app.models import Job, JobAttempt

                hit = set(
                    JobAttempt.objects.filter(job__owner=self.user, reason__contains=DISK_FULL_WORDS).values_list(
                        "job_id", flat=True
                    )
                )
                fields = ("lease_token", "lease_expires_at", "poll_claimed_until", "next_poll_at", "status", "task_id")
                # Jobs that already finished are not waiting for anything.
                waiting = Job.objects.filter(id__in=hit).exclude(status__in=["completed", "failed"])
                rows = {row[0]: row[1:] for row in waiting.values_list("id", *fields)}
                self.begin_fault("space returned", rows)["at"] = fault["freed"]

    def fault(self):
        getattr(self, f"fault_{self.scenario}")()

    def fault_4(self):
        self.begin_fault("pg_ctl restart (fast) of PostgreSQL")
        from django.db import connection

        connection.close()
        began = time.monotonic()
        self.infra.restart_postgres()
        self.events.append(f"{self.stamp()} PostgreSQL back after {time.monotonic() - began:.2f} s")

    def fault_5(self):
        # With free workers the broker's list is nearly always empty (each cluster
        # prefetches its tasks), so the restart would lose nothing. The clusters are
        # frozen (SIGSTOP) for a few seconds first: meanwhile the poller hands finished
        # tasks to collectors and the freed slots are claimed, and those tasks wait in
        # Redis — the ones the restart loses.
        key = f"django_q:{self.args.cluster_name}:q"
        frozen = [pid for name in ("worker-a", "worker-b") for pid in self.procs[name].pids()]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            until = time.monotonic() + self.rng.uniform(4.0, 6.0)
            while time.monotonic() < until:
                time.sleep(0.2)
            queued = self.infra.redis_queued(key)
            fault = self.begin_fault("Redis restarted without persistence")
            fault["broker_tasks_lost"] = queued
            self.infra.stop_redis()
            time.sleep(self.rng.uniform(0.5, 2.0))
            self.infra.start_redis()
        finally:
            for pid in frozen:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        self.events.append(f"{self.stamp()} Redis back, empty: {queued} queued broker task(s) gone; clusters thawed")
        self.live_after_restart = {}
        threading.Thread(target=self.wait_live_event, daemon=True).start()

    def wait_live_event(self):
        """A live event from any of our projects reaches a fresh subscriber after the restart."""
        from channels.layers import get_channel_layer

        from queue_app.engine.events import group_name

        async def listen():
            layer = get_channel_layer()
            channel = await layer.new_channel()
            for _, project, _ in self.providers:
                await layer.group_add(group_name(project.id), channel)
            began = time.monotonic()
            message = await asyncio.wait_for(layer.receive(channel), timeout=30)
            return time.monotonic() - began, message.get("type")

        try:
            self.live_after_restart = dict(zip(("seconds", "type"), asyncio.run(listen()), strict=True))
        except Exception as error:
            self.live_after_restart = {"error": type(error).__name__}

    def fault_6(self):
        filler = self.var / "media" / "filler"
        with open(filler, "wb") as handle:
            try:
                while True:
                    handle.write(b"\0" * (1 << 20))
                    handle.flush()
            except OSError:
                pass
        fault = self.begin_fault("media disk filled", rows={})
        fault["free_at"] = time.monotonic() + self.rng.uniform(4.0, 8.0)
        self.events.append(f"{self.stamp()} media disk full ({filler.stat().st_size >> 20} MB filler)")

    def fault_7(self):
        # The fault is there from the start (worker-b and the queue service run 60 s
        # ahead); what is measured is that nothing is taken early.
        self.events.append(f"{self.stamp()} worker-b and the queue service run {CLOCK_AHEAD_SECONDS} s ahead (skewclock)")

    # --- the end (what the books read of it) ----------------------------------------

    def stop(self):
        self.exited = {name: not proc.alive() for name, proc in self.procs.items()}
        self.exited_pids = {name: proc.pid != self.main_pids[name] for name, proc in self.procs.items()}
        super().stop()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", type=int, choices=SCENARIOS, action="append", help="repeatable; default all")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--runs", type=int, default=1, help="seeded runs of each scenario (seed, seed+1, …)")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--ci", action="store_true", help="reduced: about two minutes for all four")
    parser.add_argument("--keep", action="store_true")
    return parser.parse_args(argv)


def run_one(scenario: int, seed: int, args, infra: PrivateInfra) -> list[str]:
    jobs = args.jobs or (24 if args.ci else 120)
    soak_args = soak.parse_args(
        ["--jobs", str(jobs), "--seed", str(seed), "--workers", "3"]
        + ["--database", "rs_chaos_faults", "--database-url", infra.database_url, "--redis-url", infra.redis_url]
        + ["--cluster-name", "rs_chaos_faults"]
        + (["--ci"] if args.ci else [])
    )
    run = FaultRun(soak_args, scenario, infra)
    print(f"# chaos-faults scenario {scenario}: {jobs} jobs, seed {seed}", flush=True)
    from django.apps import apps

    if apps.ready:
        from django.db import connections

        # The database is dropped and made again: the last scenario's connection is gone.
        connections.close_all()
    run.setup()
    try:
        try:
            run.start_processes()
            run.run()
        finally:
            try:
                run.stop()
            finally:
                run.fake.stop()
        run.report()  # reads the media disk: before it is unmounted
    finally:
        run.unmount_media()
    verdict = "all assertions hold" if not run.failures else "FAILED: " + "; ".join(run.failures)
    if run.failures:  # the next scenario starts from an empty directory: keep what explains this one
        kept = ROOT / "var" / "chaos-faults-failed" / f"scenario-{scenario}-seed-{seed}"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(run.logs, kept)
        verdict += f" (logs kept in {kept})"
    print(f"chaos-faults scenario {scenario} seed {seed}: {verdict}", flush=True)
    return [f"scenario {scenario} seed {seed}: {failure}" for failure in run.failures]


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("chaos-faults needs root (tmpfs mount, runuser for the private PostgreSQL)")
        return 2
    ensure_tools()
    sys.path.insert(0, str(ROOT))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    scenarios = args.scenario or list(SCENARIOS)
    infra = PrivateInfra()
    failures = []
    try:
        infra.start()
        print(f"# private PostgreSQL :{infra.pg_port}, Redis :{infra.redis_port} in {infra.dir}", flush=True)
        for run_index in range(args.runs):
            for scenario in scenarios:
                try:
                    failures += run_one(scenario, seed + run_index, args, infra)
                except Exception as error:  # one broken run must not hide the others' books
                    print(f"chaos-faults scenario {scenario} seed {seed + run_index}: ERROR {error!r}", flush=True)
                    failures.append(f"scenario {scenario} seed {seed + run_index}: {error!r}")
    finally:
        infra.stop()
    if failures:
        runner.print_failures("CHAOS-FAULTS", failures)
        print(f"logs: {VAR / 'logs'}")
        return 1
    print("chaos-faults: all assertions hold")
    if not args.keep:
        shutil.rmtree(VAR / "media", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
