"""Finish notifications: VAPID keys, devices' push subscriptions, project runs and the
push outbox."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from queue_app.models.queue import Project


class VapidKeys(models.Model):
    """The server's Web Push (VAPID) key pair when none is configured in the environment:
    a single row (id 1), so processes that start at the same time converge on one pair."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    public_key = models.CharField(max_length=100)
    # Fernet token of the raw private key (base64url), like provider keys.
    private_key_encrypted = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "VAPID keys"

    def __str__(self):
        return "VAPID keys"


class PushSubscription(models.Model):
    """One browser (device) that switched notifications on. The endpoint is a capability
    URL: it is never logged or rendered in full."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_subscriptions")
    endpoint = models.URLField(max_length=2048, unique=True)
    p256dh = models.CharField(max_length=256)
    auth = models.CharField(max_length=256)
    user_agent = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self):
        return f"push subscription {self.pk} of user {self.user_id}"


class ProjectRun(models.Model):
    """One stretch of work of a project: opened when jobs become pending, closed exactly
    once (a compare-and-set) when none is pending or processing any more. Closing it
    records the counts and the notifications to send, in one transaction."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    opened_at = models.DateTimeField()
    # the last time jobs were started in this run (the settle delay counts from it too)
    last_started_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["project", "opened_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["project"], condition=Q(closed_at__isnull=True), name="run_one_open_per_project")
        ]

    def __str__(self):
        return f"run {self.pk} of project {self.project_id}"


class PushOutbox(models.Model):
    """One notification for one device, written in the transaction that closed its run,
    so a process that dies before sending leaves it for the next one."""

    run = models.ForeignKey(ProjectRun, on_delete=models.CASCADE, related_name="pushes")
    subscription = models.ForeignKey(PushSubscription, on_delete=models.CASCADE, related_name="outbox")
    payload = models.JSONField(default=dict)
    # "" while it is to be sent; then sent | failed
    outcome = models.CharField(max_length=10, blank=True, default="")
    attempts = models.PositiveSmallIntegerField(default=0)
    next_try_at = models.DateTimeField()
    # a sender's short claim, so two queue services never send the same row at once
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["run", "subscription"], name="push_one_per_run_and_device")]
        indexes = [models.Index(fields=["outcome", "next_try_at"], name="push_outbox_due")]

    def __str__(self):
        return f"push of run {self.run_id} to subscription {self.subscription_id}"
