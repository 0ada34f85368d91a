"""What jobs produce and what drafts start from: album items and reference images."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from queue_app.models.queue import Job, Project


def album_upload_to(item, filename):
    return f"album/{item.project_id}/{filename}"


class AlbumItem(models.Model):
    class ItemKind(models.TextChoices):
        IMAGE = "image"
        VIDEO = "video"
        AUDIO = "audio"
        TEXT = "text"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="album")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="album_items")
    # SET_NULL: clearing a failed job never deletes what it already produced.
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="album_items")
    output_index = models.PositiveSmallIntegerField(default=0)
    role = models.CharField(max_length=20, default="main")  # main | composite | layer | poster
    kind = models.CharField(max_length=10, choices=ItemKind.choices)
    file = models.FileField(upload_to=album_upload_to, max_length=300, blank=True)
    poster = models.FileField(upload_to=album_upload_to, max_length=300, blank=True)
    text = models.TextField(blank=True, default="")
    content_type = models.CharField(max_length=100, blank=True, default="")
    size = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True, default="")
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    prompt = models.TextField(blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    favourite = models.BooleanField(default=False)  # starred by its owner: the album's filter
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "job_id", "output_index"]
        constraints = [models.UniqueConstraint(fields=["job", "output_index"], name="album_one_item_per_job_output")]
        indexes = [models.Index(fields=["owner"], name="album_owner")]

    def __str__(self):
        return f"{self.kind} #{self.output_index} of job {self.job_id}"


def reference_upload_to(reference, filename):
    return f"references/{reference.owner_id}/{filename}"


class Reference(models.Model):
    """A reference image a user uploaded for their drafts: one row and one file per content
    (sha256) per user, so uploading the same picture twice stores it once. A draft names
    it as "ref:<sha256>" in `Job.references`."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="references")
    sha256 = models.CharField(max_length=64)
    file = models.FileField(upload_to=reference_upload_to, max_length=300)
    # decided from the bytes (queue_app.engine.media), never from the upload's claim
    content_type = models.CharField(max_length=100)
    size = models.BigIntegerField(default=0)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Uploaded, or named by a new draft: a reference no job names is deleted once this is
    # older than limits.REFERENCE_GRACE_SECONDS (services/references.references_prune).
    last_used_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "sha256"], name="reference_one_file_per_content")]
        indexes = [models.Index(fields=["last_used_at"], name="reference_last_used")]

    def __str__(self):
        return f"reference {self.sha256[:12]} of user {self.owner_id}"
