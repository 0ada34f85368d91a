"""ComfyUI projects: the instance a project drives, and the runner's record of each job.

A job's `status` still changes only in `queue_app.engine.transitions`; these rows hold what
the ComfyUI runner needs on top: where the instance is, who drives it now, and which
phase each in-flight job is in at the instance.
"""

import uuid

from django.conf import settings
from django.db import models

from queue_app import limits
from queue_app.models import Job, Project
from queue_app.providers import crypto


class ComfyInstance(models.Model):
    """A project's ComfyUI instance: address, credentials, workflow, bindings, plus the
    per-instance driver lease (so two queue services never drive it at once) and its
    reachability."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="comfy")
    base_url = models.CharField(max_length=500, blank=True, default="")
    username = models.CharField(max_length=200, blank=True, default="")
    # Fernet token; write-only in forms and admin, never rendered or logged.
    password_encrypted = models.TextField(blank=True, default="")
    # API-format workflow: {node_id: {"class_type", "inputs"}}
    workflow = models.JSONField(default=dict, blank=True, validators=[limits.check_workflow])
    # The workflow's node ids in the order they were written: PostgreSQL's jsonb does not
    # keep object key order, and outputs are stored in workflow order.
    node_order = models.JSONField(default=list, blank=True)
    # [{"source": "prompt" | "params.<name>" | "references.<i>", "node", "input", "kind"}]
    bindings = models.JSONField(default=list, blank=True)
    include_video = models.BooleanField(default=False)
    # The WebSocket clientId our prompts carry, so the instance's events reach our socket.
    client_id = models.CharField(max_length=64, default="", blank=True)

    driver = models.CharField(max_length=200, blank=True, default="")
    driver_until = models.DateTimeField(null=True, blank=True)
    unreachable_since = models.DateTimeField(null=True, blank=True)
    # When the instance last answered again after not answering: a prompt posted before
    # this that ComfyUI no longer knows was lost to a restart (ComfyUI keeps its queue and
    # history in memory and reports no start time), so it is posted again.
    back_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    last_checked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"ComfyUI of project {self.project_id}"

    def save(self, *args, **kwargs):
        if not self.client_id:
            self.client_id = f"remixstudio-{uuid.uuid4().hex}"
        if set(self.node_order or []) != set(self.workflow or {}):
            self.node_order = list(self.workflow or {})
        super().save(*args, **kwargs)

    password = crypto.encrypted("password_encrypted")


class ComfyRun(models.Model):
    """The runner's record of one job at its instance (one row per job, reused by retries).

    phase:
      submitting  claimed; the prompt is built, its id stored, then posted (counts in flight)
      remote      ComfyUI holds the prompt, pending or running (counts in flight)
      collecting  ComfyUI finished it; a worker downloads the outputs (no longer counts)
    """

    class Phase(models.TextChoices):
        SUBMITTING = "submitting"
        REMOTE = "remote"
        COLLECTING = "collecting"
        DONE = "done"

    job = models.OneToOneField(Job, primary_key=True, on_delete=models.CASCADE, related_name="comfy_run")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="comfy_runs")
    phase = models.CharField(max_length=12, choices=Phase.choices, default=Phase.SUBMITTING)
    # Written into the prompt's extra_data and read back from history: an entry is ours
    # only when it carries this nonce (ComfyUI does not deduplicate prompt ids).
    nonce = models.CharField(max_length=32, blank=True, default="")
    graph = models.JSONField(null=True, blank=True)
    output_order = models.JSONField(default=list, blank=True)
    remote_state = models.CharField(max_length=12, blank=True, default="")
    missing_checks = models.PositiveSmallIntegerField(default=0)
    posted_at = models.DateTimeField(null=True, blank=True)
    # ComfyUI's `number` for our prompt (POST /prompt's answer): a restart starts the
    # counter again, which tells a prompt lost to a restart from one merely late.
    remote_number = models.FloatField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    warnings = models.TextField(blank=True, default="")
    # The node the last progress came from ("node 3 (KSampler)"); Job.progress is its value/max.
    progress_node = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["project", "phase"], name="comfyrun_project_phase")]

    def __str__(self):
        return f"ComfyUI run of job {self.job_id} ({self.phase})"


class ComfyUpload(models.Model):
    """One reference upload per content, per instance address: the unique row is claimed
    before the instance is asked, so two jobs starting together with one reference upload
    it once (the second waits for the first's `stored_as`)."""

    instance = models.ForeignKey(ComfyInstance, on_delete=models.CASCADE, related_name="uploads")
    address = models.CharField(max_length=500)
    name = models.CharField(max_length=200)  # the content-hash file name
    stored_as = models.CharField(max_length=500, blank=True, default="")  # what LoadImage takes; "" while uploading
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["instance", "address", "name"], name="comfyupload_one_per_content")]

    def __str__(self):
        return f"{self.name} on instance {self.instance_id}"


class ComfyAllowedHost(models.Model):
    """A private or local host staff allow ComfyUI instances at (127.0.0.1:8188, a LAN
    address): exempt from the outbound private-address guard for ComfyUI calls only, plain
    http included when `allow_http`. Read on every check (comfy_app/allowed_hosts.py)."""

    address = models.CharField(max_length=260, unique=True, help_text="host or host:port, e.g. 192.168.1.20:8188")
    allow_http = models.BooleanField(default=True, help_text="also allow plain http (most local ComfyUI instances)")
    note = models.CharField(max_length=200, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["address"]

    def __str__(self):
        return self.address

    def entry(self) -> str:
        """As net.py's OUTBOUND_ALLOWLIST entries are written."""
        return f"http://{self.address}" if self.allow_http else self.address
