"""The chaos run across hosts: two machines, one dying whole, one cut off — and the books.

    python -m bench.chaos_hosts [--scenario 1|2|3|all] [--seed N] [--runs N] [--ci]

Root only. bench/hosts.py builds two hosts (network namespaces with their own hostnames on
a bridge) and private PostgreSQL and Redis servers on that bridge, so no fault touches the
shared servers; each host runs a qcluster and a queue service. 1: jobs flow through both
hosts; 2: a host dies whole and the other takes its running jobs, claims and collections
within LEASE_TTL_SECONDS + 5 s; 3: a partition longer than the lease while its workers are
inside slow provider calls, then healed: the other host reruns those jobs and the late
writes are fenced. Each keeps bench/chaos.py's books and adds fault → every affected job
dispatchable or running again (p100). Exit status 1 when any run fails. More in
docs/testing.md.
"""

import argparse
import dataclasses
import random
import sys
import threading
import time
from collections import Counter
from http.server import ThreadingHTTPServer
from types import SimpleNamespace

from bench import hosts, runner
from bench.chaos import Chaos
from bench.chaos_books import line
from tests.fakes.chaos_provider import ChaosProvider, _Handler

HOSTS = ["host-a", "host-b"]
LEASE_TTL = 10
SCENARIOS = {1: "two hosts", 2: "a host dies whole", 3: "a partition"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="all", choices=["1", "2", "3", "all"])
    parser.add_argument("--seed", type=int, default=None, help="seed of the first run; run i uses seed + i")
    parser.add_argument("--runs", type=int, default=1, help="runs of each scenario, seeds in a row")
    parser.add_argument("--ci", action="store_true", help="reduced size that fits in about two minutes")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per run (default 80, --ci 24; two thirds in scenario 3)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes per host")
    parser.add_argument("--keep", action="store_true", help="keep var/chaos_hosts (logs, media)")
    return parser.parse_args(argv)


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client killed mid-request (the faults here) is the fake's ledger's business,
        not a traceback on the run's output."""


class GatewayProvider(ChaosProvider):
    """The fake provider of bench/chaos.py, listening on the bridge so every host reaches
    it, and optionally slow (scenario 3 needs calls in flight across a partition)."""

    def __init__(self, *, seed: int, latency=None):
        super().__init__(seed=seed)
        self.latency = latency

    def configure(self, key, **options):
        if self.latency:
            options = {**options, "latency": self.latency}
        return super().configure(key, **options)

    def start(self):
        fake = self

        class Handler(_Handler):
            provider = fake

        self.server = QuietServer((hosts.GATEWAY, 0), Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 128
        self.thread = threading.Thread(target=self.server.serve_forever, name="chaos-provider", daemon=True)
        self.thread.start()
        return self

    @property
    def url(self):
        return f"http://{hosts.GATEWAY}:{self.port}"


class HostsChaos(Chaos):
    """One seeded run of one scenario on the two simulated hosts."""

    def __init__(self, args, *, scenario: int, seed: int, network, pg, redis):
        super().__init__(args)
        self.scenario, self.seed, self.rng = scenario, seed, random.Random(seed)
        self.sentinel = f"sk-SENTINEL-{random.Random(seed).getrandbits(64):016x}"
        self.network, self.pg, self.redis = network, pg, redis
        self.var = runner.ROOT / "var" / "chaos_hosts" / f"s{scenario}-{seed}"
        self.logs = self.var / "logs"
        self.faults: list[dict] = []
        self.other_disruptions = "; a kill here is a host's fault: its death or its partition"

    def make_fake(self):
        latency = (10.0, 22.0) if self.scenario == 3 else None
        return GatewayProvider(seed=self.seed, latency=latency).start()

    def start_processes(self):
        host_stack = dataclasses.replace(
            self.stack,
            database_url=self.pg.url(hosts.GATEWAY, self.args.database),
            redis_url=self.redis.url(hosts.GATEWAY),
        )
        more = dict(OUTBOUND_ALLOWLIST=f"{hosts.GATEWAY}:{self.fake.port}", LEASE_TTL_SECONDS=LEASE_TTL)
        if self.scenario == 3:
            # The slow provider's tasks take up to 14 s; the soak's 20 s would time them out.
            more["JOB_PROCESSING_TIMEOUT_MS"] = 60000
        env = host_stack.env(**more)
        self.procs = {}
        for host in HOSTS:
            for role, command in (("worker", "qcluster"), ("queue", "queue_service")):
                args = self.network.command(host, sys.executable, str(runner.ROOT / "manage.py"), command)
                self.procs[f"{host}.{role}"] = runner.Proc(f"{host}.{role}", args, env, self.logs)

    # --- faults --------------------------------------------------------------------

    def affected(self, host: str) -> dict:
        """What a fault on `host` interrupts: jobs its processes hold a lease on (running,
        claims taken, collections), claimed jobs no worker took yet, and detached jobs
        (any host's poller may hold their poll claim)."""
        from queue_app.models import Job, Status

        processing = Job.objects.filter(status=Status.PROCESSING)
        running = dict(processing.filter(lease_owner__startswith=f"{host}:").values_list("id", "lease_token"))
        claimed = dict(processing.filter(lease_owner="", task_id="").values_list("id", "lease_token"))
        detached = dict(processing.filter(lease_owner="").exclude(task_id="").values_list("id", "lease_token"))
        return {"running": running, "claimed": claimed, "detached": detached}

    def fault(self, kind: str, host: str, action) -> dict:
        affected = self.affected(host)
        at, stamp = time.monotonic(), self.stamp()
        action()
        entry = dict(
            name=host,
            kind=kind,
            at=at,
            graceful=False,
            pending={"running": affected["running"], "claimed": affected["claimed"]},
            detached=affected["detached"],
            recovered={},
            polled={},
        )
        self.kills.append(entry)
        self.faults.append(entry)
        self.disruptions.append(time.time())
        self.events.append(
            f"{stamp} {kind} {host}: {len(affected['running'])} running, {len(affected['claimed'])} claimed, "
            f"{len(affected['detached'])} detached"
        )
        return entry

    def host_busy(self, host: str, *, inside_calls: int = 1) -> bool:
        from queue_app.models import Job, Status

        return (
            Job.objects.filter(status=Status.PROCESSING, lease_owner__startswith=f"{host}:", task_id="").count() >= inside_calls
        )

    def track_recoveries(self):
        """As bench/chaos.py, and for detached jobs: when a live poller claimed them (a poll
        claim writes a new lease token) or they finished."""
        super().track_recoveries()
        from queue_app.models import Job

        now = time.monotonic()
        for fault in self.faults:
            waiting = {job_id: token for job_id, token in fault["detached"].items() if job_id not in fault["polled"]}
            if not waiting:
                continue
            rows = dict(Job.objects.filter(id__in=list(waiting)).values_list("id", "lease_token"))
            for job_id, token in waiting.items():
                if rows.get(job_id) != token:
                    fault["polled"][job_id] = now - fault["at"]

    def all_recovered(self) -> bool:
        return super().all_recovered() and all(len(f["polled"]) >= len(f["detached"]) for f in self.faults)

    # --- scenarios -----------------------------------------------------------------

    def run(self):
        total = self.args.jobs
        started = time.monotonic()
        self.started_wall = time.time()
        drain_timeout = (240 if self.scenario == 3 else 150) if self.args.ci else max(300, total * 2.0)
        deadline = started + drain_timeout
        self.start_jobs()
        order = self.rng.sample(HOSTS, len(HOSTS))  # seeded preference when both are busy
        state = {"done": False}
        from django.db import close_old_connections

        while True:
            close_old_connections()
            done = self.terminal_count()
            self.track_recoveries()
            now = time.monotonic()
            if done >= total and self.all_recovered():
                break
            if now > deadline:
                self.failures.append(f"drain timeout: {done}/{total} jobs finished after {drain_timeout:.0f} s")
                break
            if not state["done"]:
                self.step(order, done / total, state)
            time.sleep(0.1)
        self.elapsed = time.monotonic() - started
        time.sleep(1)

    def step(self, order: list[str], progress: float, state: dict):
        """The scenario's fault, once, on a host inside provider calls (two, or one once a
        fifth of the jobs is done, so a small run still gets its fault)."""
        if self.scenario == 1:
            state["done"] = True
            return
        if "victim" not in state:
            if progress < 0.1:
                return
            calls = 2 if progress < 0.2 else 1
            busy = [host for host in order if self.host_busy(host, inside_calls=calls)]
            if not busy:
                return
            victim = state["victim"] = busy[0]
            if self.scenario == 2:
                self.fault("host death", victim, lambda: self.network.kill_all(victim))
                state["done"] = True
            else:
                ports = [self.pg.port, self.redis.port]
                self.fault("partition", victim, lambda: self.network.partition(victim, ports))
                state["until"] = time.monotonic() + LEASE_TTL + 8
        elif time.monotonic() >= state["until"]:
            self.network.heal(state["victim"])
            self.events.append(f"{self.stamp()} partition of {state['victim']} healed after {LEASE_TTL + 8} s")
            state["done"] = True

    # --- books ---------------------------------------------------------------------

    def report(self):
        super().report()
        from queue_app.models import JobAttempt

        workers = JobAttempt.objects.filter(job__owner=self.user).values_list("worker", flat=True)
        per_host = {host: sum(1 for w in workers if w.startswith(f"{host}:")) for host in HOSTS}
        line("attempts_per_host", ", ".join(f"{h} {n}" for h, n in per_host.items()))
        if self.scenario == 1:
            self.check("both hosts worked", all(per_host.values()), f"attempts per host {per_host}")
        bound = LEASE_TTL + 5
        for fault in self.faults:
            times = [t for (kind, _), t in fault["recovered"].items()]
            polled = list(fault["polled"].values())
            worst = max(times, default=0.0)
            line(
                f"{fault['kind'].replace(' ', '_')}.fault_to_dispatchable_p100",
                f"{worst:.2f}",
                "s",
                f"bound {bound} s; {len(fault['pending']['running'])} running, {len(fault['pending']['claimed'])} claimed",
            )
            line(
                f"{fault['kind'].replace(' ', '_')}.detached_polled_p100",
                f"{max(polled, default=0.0):.2f}",
                "s",
                f"{len(fault['detached'])} detached jobs at the fault",
            )
            self.check(f"{fault['kind']} recovery", worst <= bound, f"p100 {worst:.1f} s > {bound} s")
            self.fault_submissions(fault)
        if self.scenario in (2, 3) and not self.faults:
            self.check("fault", False, f"the {SCENARIOS[self.scenario]} never happened (victim never busy)")

    def fault_submissions(self, fault):
        """Extra paid submissions of the jobs a fault interrupted, and what the victim's
        attempts of them recorded (explained or not, bench/chaos.py's books judge)."""
        from queue_app.models import JobAttempt

        name = fault["kind"].replace(" ", "_")
        token_of = {str(job_id): token for token, job_id in self.job_by_token.items()}
        affected = [str(job_id) for kind in ("running", "claimed") for job_id in fault["pending"][kind]]
        counts = self.fake.submissions_per_job()
        extra = sum(max(0, counts.get(token_of.get(job_id, ""), 0) - 1) for job_id in affected)
        outcomes = Counter(
            JobAttempt.objects.filter(job_id__in=affected, worker__startswith=f"{fault['name']}:").values_list(
                "outcome", flat=True
            )
        )
        line(
            f"{name}.extra_paid_submissions",
            extra,
            "submissions",
            f"of its {len(affected)} interrupted jobs; the {fault['name']} attempts of them ended "
            + (", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "none"),
        )


def run_one(args, scenario: int, seed: int, network, pg, redis) -> list[str]:
    opts = SimpleNamespace(
        # Scenario 3's provider calls take 10-22 s: two thirds of the jobs keep its run short.
        jobs=args.jobs or (24 if args.ci else 80) * (2 if scenario == 3 else 3) // 3,
        seed=seed,
        ci=args.ci,
        database="rs_chaos_hosts",
        database_url=pg.url(),
        redis_url=redis.url(),
        cluster_name="rs_chaos_hosts",
        # Scenario 3's 10-22 s calls would keep three workers busy while claims wait in the
        # broker: enough workers per host that one host alone fills every slot.
        workers=args.workers if scenario != 3 else max(args.workers, 8),
        kill_every=(3.0, 6.0),
        drain_timeout=None,
        keep=args.keep,
    )
    run = HostsChaos(opts, scenario=scenario, seed=seed, network=network, pg=pg, redis=redis)
    print(f"# scenario {scenario} ({SCENARIOS[scenario]}): {opts.jobs} jobs, seed {seed}", flush=True)
    # Settings are read once per process: every run uses the same database name, dropped
    # and created again, so this process's connection to the last one must go first.
    from django.conf import settings

    if settings.configured:
        from django.db import connections

        connections.close_all()
    run.setup()
    try:
        run.start_processes()
        run.run()
    finally:
        run.stop()
        run.fake.stop()
    run.report()
    for failure in run.failures:
        print(f"  FAILED scenario {scenario} seed {seed}: {failure}")
    print(f"# logs: {run.logs}" if run.failures else f"# scenario {scenario} seed {seed}: all assertions hold", flush=True)
    return [f"scenario {scenario} seed {seed}: {failure}" for failure in run.failures]


def main(argv=None) -> int:
    args = parse_args(argv)
    base_seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    scenarios = [1, 2, 3] if args.scenario == "all" else [int(args.scenario)]
    hosts.ensure_tools()
    network = hosts.Network(HOSTS).up()
    pg = hosts.PrivatePostgres().start()
    redis = hosts.PrivateRedis().start()
    print(f"# private PostgreSQL :{pg.port}, Redis :{redis.port}, hosts {network.hosts}", flush=True)
    failures = []
    try:
        for scenario in scenarios:
            for index in range(args.runs):
                failures += run_one(args, scenario, base_seed + index, network, pg, redis)
    finally:
        hosts.teardown()
    if failures:
        runner.print_failures("CHAOS-HOSTS", failures)
        return 1
    print(f"chaos-hosts: all assertions hold (scenarios {scenarios}, seeds {base_seed}..{base_seed + args.runs - 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
