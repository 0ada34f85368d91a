"""Run the web server, the worker cluster and the queue service together.

Each process gets its own session, so Ctrl-C reaches only this runner; on stop it sends
SIGTERM to each child's main process alone — qcluster stops cleanly only that way (a
SIGTERM to its whole process group kills its workers mid-task and hangs it, measured in
../shared/reference). After a grace period anything left is killed by process group.
When one process exits, the others are stopped, as honcho does.

`--prepare` (what `make run` calls) does in this process what used to be three commands
before it: migrate (only when a migration is unapplied), start the web process, create the
demo account, run the recovery scan, then (once the web process listens) start the
workers and the queue service — one Python start-up instead of four, and the web process
starting alone, so the first page comes sooner.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

GRACE_SECONDS = 30
LISTEN_WAIT_SECONDS = 30  # --prepare: the workers start once the web process listens, or after this


class Command(BaseCommand):
    help = "Start daphne, qcluster and the queue service; Ctrl-C stops them cleanly."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.getenv("HOST", "127.0.0.1"))
        parser.add_argument("--port", default=os.getenv("PORT", "8000"))
        parser.add_argument("--prepare", action="store_true", help="migrate, seed the demo and run the recovery scan first")

    def handle(self, *args, host, port, prepare, **options):
        python = sys.executable
        manage = os.path.abspath(sys.argv[0])
        commands = {
            "web": [python, "-m", "daphne", "-b", host, "-p", str(port), "remixstudio.asgi:application"],
            "worker": [python, manage, "qcluster"],
            "queue": [python, manage, "queue_service"],
        }
        procs = {}
        if prepare:
            self._migrate()
        for name, cmd in commands.items():
            if name == "worker" and prepare:
                # before any worker runs: the demo account and the recovery scan; then the
                # web process gets the machine to itself until it listens (the first page)
                call_command("seed_demo")
                call_command("recover_queue")
                self._wait_listening(host, int(port), procs["web"])
            procs[name] = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True, bufsize=1
            )
            threading.Thread(target=self._pump, args=(name, procs[name]), daemon=True).start()
        self.stdout.write(self.style.SUCCESS(f"Remix Studio Queue is running at http://{host}:{port}/  (Ctrl-C stops it)"))
        stopping = {"flag": False}

        def request_stop(signum, frame):
            stopping["flag"] = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        while not stopping["flag"] and all(p.poll() is None for p in procs.values()):
            time.sleep(0.2)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the main process only
        deadline = time.monotonic() + GRACE_SECONDS
        for name, proc in procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stdout.write(f"{name} did not stop in {GRACE_SECONDS} s; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.stdout.write("stopped: " + ", ".join(f"{name} ({proc.returncode})" for name, proc in procs.items()))

    def _migrate(self) -> None:
        """Apply unapplied migrations; none (every start but the first) costs one query."""
        connection = connections[DEFAULT_DB_ALIAS]
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            call_command("migrate", interactive=False, verbosity=1)
        connection.close()

    @staticmethod
    def _wait_listening(host: str, port: int, web, limit: float = LISTEN_WAIT_SECONDS) -> None:
        deadline = time.monotonic() + limit
        while web.poll() is None and time.monotonic() < deadline:
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)

    def _pump(self, name, proc):
        for line in proc.stdout:
            sys.stdout.write(f"{name:>6} | {line}")
            sys.stdout.flush()
