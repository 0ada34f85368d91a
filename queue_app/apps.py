import sys

from django.apps import AppConfig


class QueueAppConfig(AppConfig):
    name = "queue_app"
    verbose_name = "Queue"

    def ready(self):
        # The admin is the web role's (queue_app/web/admin.py); Django's autodiscovery
        # looks for queue_app.admin, so it is registered here.
        from django.db.models.signals import pre_delete

        from queue_app.engine import attempt_tally
        from queue_app.models import Project
        from queue_app.web import admin  # noqa: F401

        # A deleted project (or user) leaves its attempts' counts in the tallies.
        pre_delete.connect(attempt_tally.fold_project, sender=Project, dispatch_uid="fold_project_attempts")

        # A qcluster process announces itself so the monitor can tell when dispatchable
        # work has no live worker to take it.
        if len(sys.argv) > 1 and sys.argv[1] == "qcluster":
            from queue_app.engine import heartbeats

            heartbeats.start_worker_heartbeat()
