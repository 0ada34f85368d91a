"""Proof under fire, part two, scenarios 4–7: the infrastructure fails under a running queue.

    python -m bench.chaos_faults [--scenario N] [--seed S] [--runs R] [--ci]

4. PostgreSQL restarts mid-run: every process reconnects on its own, none exits.
5. Redis restarts without persistence mid-run: the broker's queued tasks are gone; the
   jobs behind them are reclaimed (claim leases, healing) and complete; live events resume.
6. The media disk fills up (a small tmpfs at MEDIA_ROOT, filled with a file): no partial
   album item, no half-written file; the jobs wait with the reason and complete once the
   filler is deleted.
7. One host's clock runs 60 s ahead (bench/skewclock.py: one qcluster and the queue
   service): no early heal, no lease or claim stolen — leases are measured on the
   database's clock.

Each run is bench/chaos.py's soak (its fake provider with injected faults, its books:
jobs lost, duplicate album items, concurrency violations from exact intervals, leaked
slots, extra paid submissions with their cause) with one infrastructure fault instead of
the kills, plus the scenario's own books and "fault → every affected job dispatchable or
running again" (p100). Everything runs against PRIVATE PostgreSQL and Redis instances this
script starts on free ports in a temporary directory (never the shared servers) and tears
down at the end, also on failure. Needs root (tmpfs, runuser), Debian's postgresql-15 and
redis-server (installed with apt-get when missing) and a C compiler (the clock shim).
"""

import argparse
import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import chaos as soak
from bench import runner, skewclock

ROOT = runner.ROOT
PG_BIN = Path("/usr/lib/postgresql/15/bin")
VAR = ROOT / "var" / "chaos-faults"
DISK_FULL_WORDS = "media disk is full"
CLOCK_AHEAD_SECONDS = 60
SCENARIOS = (4, 5, 6, 7)
line = soak.line


def clock_ahead_env() -> dict:
    """Scenario 7's environment for worker-b and the queue service: their wall clock
    CLOCK_AHEAD_SECONDS ahead, their monotonic clock and timed waits untouched."""
    return skewclock.env(skewclock.build(ROOT / "var" / "skewclock"), CLOCK_AHEAD_SECONDS)


def free_port(start: int) -> int:
    for port in range(start, start + 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port from {start}")


def ensure_tools() -> None:
    missing = [
        pkg for pkg, path in (("gcc", Path("/usr/bin/cc")), ("redis-server", Path("/usr/bin/redis-server"))) if not path.exists()
    ]
    if not (PG_BIN / "initdb").exists():
        missing.append("postgresql-15")
    if missing:
        subprocess.run(
            ["apt-get", "install", "-y", *missing], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        )


class PrivateInfra:
    """A PostgreSQL cluster and a Redis server of our own, in a temporary directory."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="chaos-faults-"))
        self.pg_port = free_port(55532)
        self.redis_port = free_port(56479)
        self.pgdata = self.dir / "pg"
        self.pg_started = self.redis_started = False

    @property
    def database_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.pg_port}/postgres"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def _pg(self, *args: str, check: bool = True) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *args], check=check, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )

    def start(self) -> None:
        shutil.chown(self.dir, "postgres")
        self._pg(str(PG_BIN / "initdb"), "-D", str(self.pgdata), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-p {self.pg_port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-o", options, "-l", str(self.dir / "pg.log"), "-w", "start")
        self.pg_started = True
        self.start_redis()

    def start_redis(self) -> None:
        subprocess.run(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--daemonize", "yes", "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")],
            check=True,
        )
        self.redis_started = True
        runner.wait_for(self._redis_up, timeout=10, message="the private Redis to answer")

    def _redis_up(self) -> bool:
        return (
            subprocess.run(["redis-cli", "-p", str(self.redis_port), "ping"], capture_output=True, text=True).stdout.strip()
            == "PONG"
        )

    def restart_postgres(self) -> None:
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "restart")

    def stop_redis(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"], capture_output=True)
        runner.wait_for(lambda: not self._redis_up(), timeout=10, message="the private Redis to stop")

    def redis_queued(self, key: str) -> int:
        out = subprocess.run(["redis-cli", "-p", str(self.redis_port), "llen", key], capture_output=True, text=True).stdout
        return int(out.strip() or 0)

    def stop(self) -> None:
        if self.redis_started:
            subprocess.run(["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"], capture_output=True)
        if self.pg_started:
            self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


class FaultRun(soak.Chaos):
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

    # --- the books -----------------------------------------------------------------

    def resubmission_cause(self, outcome: str, reason: str) -> bool:
        # A synchronous provider's result that found the disk full is paid for again.
        return super().resubmission_cause(outcome, reason) or (outcome == "local" and DISK_FULL_WORDS in reason)

    def stop(self):
        self.exited = {name: not proc.alive() for name, proc in self.procs.items()}
        self.exited_pids = {name: proc.pid != self.main_pids[name] for name, proc in self.procs.items()}
        super().stop()

    def report(self):
        from django.db import close_old_connections

        close_old_connections()
        print(f"# scenario {self.scenario}")
        super().report()
        times = [t for fault in self.faults for t in fault["recovered"].values()]
        affected = sum(len(fault["rows"]) for fault in self.faults)
        line(
            "fault_to_dispatchable_p100",
            f"{max(times, default=0):.2f}",
            "s",
            f"{affected} affected job(s): every one healed, re-claimed, renewed, polled or finished again",
        )
        unrecovered = affected - len(times)
        self.check("fault recovered", unrecovered == 0, f"{unrecovered} affected job(s) never touched again")
        exited = sorted(name for name, gone in self.exited.items() if gone)
        line("processes_exited", len(exited), "", f"must be 0 {exited}")
        self.check("no process exits", not exited, f"{exited}")
        getattr(self, f"books_{self.scenario}")()

    def books_4(self):
        pass

    def books_5(self):
        fault = self.faults[0] if self.faults else {}
        line("broker_tasks_lost", fault.get("broker_tasks_lost", 0), "tasks", "queued in Redis when it restarted")
        live = getattr(self, "live_after_restart", {})
        line("live_event_after_restart", f"{live.get('seconds', float('nan')):.2f}", "s", f"{live}")
        self.check("live events resume", "seconds" in live, f"no live event after the restart: {live}")

    def books_6(self):
        from queue_app.models import AlbumItem, Job, JobAttempt

        media = self.var / "media"
        hit = JobAttempt.objects.filter(job__owner=self.user, reason__contains=DISK_FULL_WORDS)
        failed_full = Job.objects.filter(owner=self.user, status="failed", error__contains=DISK_FULL_WORDS).count()
        line("disk_full_attempts", hit.count(), "attempts", f"{hit.values('job_id').distinct().count()} jobs waited")
        line("failed_disk_full", failed_full, "jobs", "failed with the reason after their attempts (reported)")
        parts = [p for p in (media / "tmp").rglob("*")] if (media / "tmp").exists() else []
        line("half_written_files", len(parts), "files", "must be 0")
        self.check("half-written files", not parts, f"{len(parts)} left in media/tmp")
        names = set()
        missing = 0
        for file_name, poster in AlbumItem.objects.filter(owner=self.user).values_list("file", "poster"):
            for name in (file_name, poster):
                if name:
                    names.add(name)
                    missing += not (media / name).is_file()
        stray = [p for p in (media / "album").rglob("*") if p.is_file() and str(p.relative_to(media)) not in names]
        line("album_items_without_file", missing, "items", "must be 0")
        line("files_without_album_item", len(stray), "files", "must be 0")
        self.check("album items without file", missing == 0, f"{missing}")
        self.check("files without album item", not stray, f"{len(stray)}")
        self.check("the disk filled", hit.exists(), "no job met the full disk: the fault did not bite")

    def books_7(self):
        from queue_app.models import JobAttempt, ProjectEvent

        interrupted = JobAttempt.objects.filter(job__owner=self.user, outcome="interrupted").count()
        lease_lost = JobAttempt.objects.filter(job__owner=self.user, outcome="lost", reason__contains="lease lost").count()
        healed = ProjectEvent.objects.filter(project__owner=self.user, kind="job.healed").count()
        released = self.procs["queue"].log().count("worker cluster(s) gone")
        line("early_heals", healed, "jobs", "must be 0: no process died, so no lease ran out")
        line("attempts_interrupted", interrupted, "attempts", "must be 0")
        line("leases_lost", lease_lost, "attempts", "must be 0")
        line("live_clusters_declared_dead", released, "times", "must be 0")
        self.check(
            "early heals", healed + interrupted + lease_lost + released == 0, f"{healed}/{interrupted}/{lease_lost}/{released}"
        )
        if healed + interrupted + lease_lost:
            self.explain_heals()

    def explain_heals(self):
        """What each healed or interrupted job went through, on the database's clock: the
        private database is gone after the run, and this is what tells why."""
        from django.db.models import Q

        from queue_app.models import JobAttempt, ProjectEvent

        odd = Q(kind="job.healed") | Q(job_id__in=JobAttempt.objects.filter(outcome__in=["interrupted", "lost"]).values("job_id"))
        job_ids = set(ProjectEvent.objects.filter(project__owner=self.user).filter(odd).values_list("job_id", flat=True))
        for job_id in sorted(map(str, job_ids)):
            print(f"#   job {job_id}:")
            events = ProjectEvent.objects.filter(job_id=job_id).order_by("seq")
            for at, kind, status, payload in events.values_list("created_at", "kind", "status", "payload"):
                print(f"#     {at:%H:%M:%S.%f} event {kind} {status} {payload}")
            attempts = JobAttempt.objects.filter(job_id=job_id).order_by("number")
            for number, worker, began, ended, outcome, reason in attempts.values_list(
                "number", "worker", "started_at", "finished_at", "outcome", "reason"
            ):
                ended = f"{ended:%H:%M:%S.%f}" if ended else "-"
                print(f"#     attempt {number} {worker} {began:%H:%M:%S.%f} → {ended} {outcome} {reason[:120]}")


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
        print("CHAOS-FAULTS FAILED:")
        for failure in failures:
            print("  - " + failure)
        print(f"logs: {VAR / 'logs'}")
        return 1
    print("chaos-faults: all assertions hold")
    if not args.keep:
        shutil.rmtree(VAR / "media", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
