import signal

from django.core.management.base import BaseCommand

from queue_app.queue_service.loop import QueueService


class Command(BaseCommand):
    help = "Run the queue service: the recovery scan, then healing, dispatch, polling and runner timers."

    def add_arguments(self, parser):
        parser.add_argument("--max-ticks", type=int, default=None, help="stop after this many ticks (tests)")

    def handle(self, *args, max_ticks=None, **options):
        service = QueueService()

        def stop(signum, frame):
            service.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"queue service {service.name} starting")
        self.stdout.flush()
        service.run(max_ticks=max_ticks)
        self.stdout.write("queue service stopped")
