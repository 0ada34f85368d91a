import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from queue_app.selectors.queue import queue_status


class _Everyone:
    is_staff = True
    pk = None


class Command(BaseCommand):
    help = "Print the queue status (totals and per provider) for operators."

    def add_arguments(self, parser):
        parser.add_argument("--user", help="only this user's queue (username)")
        parser.add_argument("--json", action="store_true", help="print the status as JSON")

    def handle(self, *args, user=None, json=False, **options):
        who = get_user_model().objects.get(username=user) if user else _Everyone()
        status = queue_status(user=who, breakdown="providers")
        if json:
            self.stdout.write(_dumps(status))
            return
        t = status["totals"]
        self.stdout.write(
            f"pending {t['pending']} (queued {t['queued']}, waiting {t['waiting']})  "
            f"processing {t['processing']} (running {t['running']}, detached {t['detached']}, stalled {t['stalled']})  "
            f"failed {t['failed']}  slots {t['active_slots']}/{t['concurrency']}"
        )
        age = t["oldest_queued_age_seconds"]
        self.stdout.write(f"oldest queued job: {age:.1f} s" if age is not None else "oldest queued job: none")
        self.stdout.write(
            f"live: {status['liveness']['workers']} worker cluster(s), {status['liveness']['queue_services']} queue service(s)"
        )
        for warning in status["warnings"]:
            self.stdout.write(self.style.WARNING("warning: " + warning))
        for p in status["providers"]:
            state = (
                "paused" if p["paused"] else (f"cooling until {p['cooling_down_until']}" if p["cooling_down_until"] else "active")
            )
            self.stdout.write(
                f"  {p['name']} [{p['family']}] {state}: slots {p['active_slots']}/{p['concurrency']}, "
                f"queued {p['queued']}, waiting {p['waiting']}, running {p['running']}, "
                f"detached {p['detached']}, failed {p['failed']}"
            )


def _dumps(value) -> str:
    return json.dumps(value, indent=2, default=str)
