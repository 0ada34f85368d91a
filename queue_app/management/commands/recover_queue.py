from django.core.management.base import BaseCommand

from queue_app.queue_service import recovery


class Command(BaseCommand):
    help = "Run the recovery scan once: heal interrupted jobs, resume detached polls, dispatch pending work."

    def handle(self, *args, **options):
        counts = recovery.recover()
        self.stdout.write("recovery scan: " + ", ".join(f"{key} {value}" for key, value in counts.items()))
