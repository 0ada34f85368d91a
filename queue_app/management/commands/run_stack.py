"""Run the web server, the worker cluster and the queue service together.

Each process gets its own session, so Ctrl-C reaches only this runner; on stop it sends
SIGTERM to each child's main process alone — qcluster stops cleanly only that way (a
SIGTERM to its whole process group kills its workers mid-task and hangs it, measured in
../shared/reference). After a grace period anything left is killed by process group.
When one process exits, the others are stopped, as honcho does.
"""

import os
import signal
import subprocess
import sys
import threading
import time

from django.core.management.base import BaseCommand

GRACE_SECONDS = 30


class Command(BaseCommand):
    help = "Start daphne, qcluster and the queue service; Ctrl-C stops them cleanly."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.getenv("HOST", "127.0.0.1"))
        parser.add_argument("--port", default=os.getenv("PORT", "8000"))

    def handle(self, *args, host, port, **options):
        python = sys.executable
        manage = os.path.abspath(sys.argv[0])
        commands = {
            "web": [python, "-m", "daphne", "-b", host, "-p", str(port), "remixstudio.asgi:application"],
            "worker": [python, manage, "qcluster"],
            "queue": [python, manage, "queue_service"],
        }
        procs = {}
        for name, cmd in commands.items():
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

    def _pump(self, name, proc):
        for line in proc.stdout:
            sys.stdout.write(f"{name:>6} | {line}")
            sys.stdout.flush()
