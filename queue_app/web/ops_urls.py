"""The operator's view (issue 13): health checks, Prometheus metrics, the workers page and
the monitor's bulk actions. A module of its own so these routes sit apart from the pages'."""

from django.urls import path

from queue_app.web import health, metrics, search, workers

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("livez", health.livez, name="livez"),
    path("readyz", health.readyz, name="readyz"),
    path("fleetz", health.fleetz, name="fleetz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("queue/workers/", workers.workers, name="queue_workers"),
    path("queue/jobs/bulk", search.bulk_action, name="monitor_bulk"),
]
