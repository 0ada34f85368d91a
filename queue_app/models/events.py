"""Live events (the outbox of each project's event stream) and process heartbeats."""

from django.db import models

from queue_app.models.queue import Project


class EventCounter(models.Model):
    """The last live-event sequence number handed out per project. A table of its own so
    that saving a project (a form, the admin) can never rewind it."""

    project = models.OneToOneField(Project, primary_key=True, on_delete=models.CASCADE, related_name="event_counter")
    last = models.BigIntegerField(default=0)

    def __str__(self):
        return f"events of project {self.project_id}: {self.last}"


class ProjectEvent(models.Model):
    """Outbox of live events: written in the transaction that made the change."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=40)
    job_id = models.UUIDField(null=True, blank=True)
    status = models.CharField(max_length=12, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "seq"]
        constraints = [models.UniqueConstraint(fields=["project", "seq"], name="event_seq_unique_per_project")]
        indexes = [models.Index(fields=["created_at"], name="event_created")]

    def __str__(self):
        return f"{self.kind} #{self.seq} of project {self.project_id}"


class Heartbeat(models.Model):
    """Liveness of our processes: worker clusters, queue services and web processes."""

    class Role(models.TextChoices):
        WORKER = "worker"
        QUEUE_SERVICE = "queue_service"
        WEB = "web"

    name = models.CharField(max_length=200, unique=True)
    role = models.CharField(max_length=20, choices=Role.choices)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()
    # A worker cluster's processes (its sentinel, workers, pusher; recent ones kept): an
    # attempt names the worker's own pid, which maps it to its cluster on a shared host.
    children = models.JSONField(default=list, blank=True)
    # A tombstone: the heal found this process dead and released what it held. The row
    # stays (the workers page lists it among the dead) but no longer counts as alive.
    released_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return self.name
