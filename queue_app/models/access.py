"""API access: personal tokens and idempotency keys."""

from django.conf import settings
from django.db import models


class IdempotencyKey(models.Model):
    """A start (or create) request remembered by the key its client sent."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    key = models.CharField(max_length=200)
    scope = models.CharField(max_length=100)
    request_hash = models.CharField(max_length=64)
    # null while the first request is still running
    response = models.JSONField(null=True, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_per_user")]

    def __str__(self):
        return f"idempotency key of user {self.owner_id}"


class ApiToken(models.Model):
    """A personal API token (JSON API and MCP). Only a SHA-256 of the token is stored; the
    token itself is shown once, when it is created."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # the first characters of the token, so its owner can tell tokens apart
    prefix = models.CharField(max_length=16)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "id"]

    def __str__(self):
        return f"API token {self.prefix}… of user {self.owner_id}"
