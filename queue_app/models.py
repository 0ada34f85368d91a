"""Projects, providers, jobs, attempts, album items, live events.

A job's `status` is never assigned here or anywhere but `queue_app.engine.transitions`.

Longer than ~400 lines on purpose: these are the tables of one Django app, mostly field
declarations and the constraints that pin the invariants (one slot per job, one open run
per project); read together they are the data model, and a `models/` package would only
scatter them.
"""

import uuid

from django.conf import settings
from django.core.validators import MaxLengthValidator
from django.db import models
from django.db.models import Q

from queue_app import limits
from queue_app.providers import crypto


class Family(models.TextChoices):
    DEMO = "demo"
    OPENAI = "openai"
    GOOGLE = "google"
    RUNNINGHUB = "runninghub"
    CIVITAI = "civitai"
    REPLICATE = "replicate"


class Kind(models.TextChoices):
    IMAGE = "image"
    VIDEO = "video"
    TEXT = "text"
    AUDIO = "audio"
    COMFYUI = "comfyui"


class Status(models.TextChoices):
    DRAFT = "draft"
    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"


class ErrorClass(models.TextChoices):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    AMBIGUOUS = "ambiguous"
    TIMEOUT = "timeout"
    LOCAL = "local"
    # Not a failure of the provider: the user cancelled the job (a failed job with this
    # reason code; the monitor shows it as "Cancelled"; retry and clear work on it).
    CANCELLED = "cancelled"
    # Held for attention: the provider may have accepted the submission but we hold no
    # task id, and the provider record says not to risk paying twice (engine/ambiguous.py).
    # A failed job the monitor lists as "Needs attention" with Resubmit / Mark failed.
    ATTENTION = "attention"


class AccountSettings(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="account")
    storage_limit_bytes = models.BigIntegerField(default=settings.DEFAULT_STORAGE_LIMIT_BYTES)

    class Meta:
        verbose_name_plural = "account settings"

    def __str__(self):
        return f"settings of {self.user}"


class Provider(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="providers")
    name = models.CharField(max_length=100)
    family = models.CharField(max_length=20, choices=Family.choices)
    # Fernet tokens; read through api_key / api_secret, never rendered.
    api_key_encrypted = models.TextField(blank=True, default="")
    api_secret_encrypted = models.TextField(blank=True, default="")
    api_key_hint = models.CharField(max_length=4, blank=True, default="")
    base_url = models.URLField(blank=True, default="")
    options = models.JSONField(default=dict, blank=True, validators=[limits.check_provider_options])
    # Bounds from queue_app.limits: the validators serve forms and admin, the check
    # constraints hold them for every other writer.
    concurrency = models.PositiveIntegerField(default=1, validators=[limits.CONCURRENCY.validator()])
    max_attempts = models.PositiveSmallIntegerField(
        default=settings.DEFAULT_MAX_ATTEMPTS, validators=[limits.MAX_ATTEMPTS.validator()]
    )
    paused = models.BooleanField(default=False)
    # Why the queue paused it (a rejected key, no credit); empty when a person did.
    paused_reason = models.CharField(max_length=300, blank=True, default="")
    cooldown_until = models.DateTimeField(null=True, blank=True)
    # custom alias -> base model id of the catalogue
    model_aliases = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(concurrency__gte=1), name="provider_concurrency_gte_1"),
            models.CheckConstraint(
                condition=Q(concurrency__lte=limits.CONCURRENCY.high), name="provider_concurrency_within_limit"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=limits.MAX_ATTEMPTS.low, max_attempts__lte=limits.MAX_ATTEMPTS.high),
                name="provider_max_attempts_within_limit",
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.family})"

    def __repr__(self):
        return f"<Provider {self.pk} {self.name!r} {self.family}>"

    @property
    def api_key(self) -> str:
        return crypto.decrypt(self.api_key_encrypted)

    @api_key.setter
    def api_key(self, value: str) -> None:
        self.api_key_encrypted = crypto.encrypt(value)
        self.api_key_hint = value[-4:] if len(value) >= 8 else ""

    @property
    def api_secret(self) -> str:
        return crypto.decrypt(self.api_secret_encrypted)

    @api_secret.setter
    def api_secret(self, value: str) -> None:
        self.api_secret_encrypted = crypto.encrypt(value)


class Project(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="projects")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.IMAGE)
    provider = models.ForeignKey(Provider, null=True, blank=True, on_delete=models.SET_NULL, related_name="projects")
    model = models.CharField(max_length=200, blank=True, default="")
    aspect_ratio = models.CharField(max_length=30, blank=True, default="")
    quality = models.CharField(max_length=30, blank=True, default="")
    resolution = models.CharField(max_length=30, blank=True, default="")
    format = models.CharField(max_length=10, blank=True, default="")
    background = models.CharField(max_length=20, blank=True, default="")
    duration = models.PositiveIntegerField(null=True, blank=True)
    sound = models.CharField(max_length=10, blank=True, default="")
    system_prompt = models.TextField(blank=True, default="")
    temperature = models.FloatField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Hidden from the project list by default; its jobs and album stay as they are.
    archived = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "id"]

    def __str__(self):
        return self.name


class JobQuerySet(models.QuerySet):
    def fenced(self, job_id, token):
        """The job while it is processing under the lease `token`. Every write of an
        execution filters through this: a write that matches no row means the job was
        taken from its worker (healed, cleared, retried), which then writes nothing."""
        return self.filter(id=job_id, lease_token=token, status=Status.PROCESSING)


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="jobs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.DRAFT)
    prompt = models.TextField(validators=[MaxLengthValidator(limits.PROMPT_CHARS)])
    references = models.JSONField(default=list, blank=True, validators=[limits.check_references])

    # What the draft asked for; blanks fall back to the project at claim time.
    provider = models.ForeignKey(Provider, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    model = models.CharField(max_length=200, blank=True, default="")
    aspect_ratio = models.CharField(max_length=30, blank=True, default="")
    quality = models.CharField(max_length=30, blank=True, default="")
    resolution = models.CharField(max_length=30, blank=True, default="")
    format = models.CharField(max_length=10, blank=True, default="")
    background = models.CharField(max_length=20, blank=True, default="")
    duration = models.PositiveIntegerField(null=True, blank=True, validators=[limits.DURATION.validator()])
    sound = models.CharField(max_length=10, blank=True, default="")
    params = models.JSONField(default=dict, blank=True, validators=[limits.check_params])

    # The resolved snapshot, written at claim: the poller and the output writer read this,
    # never the project.
    resolved = models.JSONField(null=True, blank=True)
    # The provider whose slot this job holds; set only while processing.
    active_provider = models.ForeignKey(Provider, null=True, blank=True, on_delete=models.PROTECT, related_name="active_jobs")
    slot = models.PositiveSmallIntegerField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    not_before = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    error_class = models.CharField(max_length=10, choices=ErrorClass.choices, blank=True, default="")

    task_id = models.CharField(max_length=512, blank=True, default="")
    # Start of the window the processing timeout counts from (reset by the recovery scan).
    task_observed_at = models.DateTimeField(null=True, blank=True)
    next_poll_at = models.DateTimeField(null=True, blank=True)
    # A poller's short claim on a detached job, so two cycles never check it at once.
    poll_claimed_until = models.DateTimeField(null=True, blank=True)
    poll_failures = models.PositiveSmallIntegerField(default=0)
    progress = models.FloatField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["status", "queued_at"], name="job_status_queued"),
            models.Index(fields=["active_provider", "status"], name="job_active_provider"),
            models.Index(fields=["provider", "status"], name="job_provider_status"),
            models.Index(fields=["project", "status"], name="job_project_status"),
            models.Index(fields=["owner", "status"], name="job_owner_status"),
            models.Index(fields=["status", "next_poll_at"], name="job_status_poll"),
            models.Index(fields=["status", "lease_expires_at"], name="job_status_lease"),
            # the Queue Monitor's job list, newest first, reads this index backwards
            models.Index(fields=["created_at", "id"], name="job_created"),
        ]
        constraints = [
            # The database's own backstop for the concurrency limit: one job per slot.
            models.UniqueConstraint(
                fields=["active_provider", "slot"],
                condition=Q(status="processing"),
                name="job_one_job_per_provider_slot",
            ),
            # A slot exists exactly while a job is processing under a provider.
            models.CheckConstraint(
                condition=(
                    Q(status="processing", active_provider__isnull=False, slot__isnull=False)
                    | Q(active_provider__isnull=True, slot__isnull=True)
                ),
                name="job_slot_iff_processing_with_provider",
            ),
        ]

    def __str__(self):
        return f"job {self.pk} ({self.status})"


class JobAttempt(models.Model):
    """Append-only: one row per execution attempt of a job."""

    class Outcome(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        DETACHED = "detached"
        PERMANENT = "permanent"
        TRANSIENT = "transient"
        RATE_LIMITED = "rate_limited"
        AMBIGUOUS = "ambiguous"
        TIMEOUT = "timeout"
        LOCAL = "local"
        INTERRUPTED = "interrupted"
        LOST = "lost"
        CANCELLED = "cancelled"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveSmallIntegerField()
    worker = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=14, choices=Outcome.choices, default=Outcome.RUNNING)
    reason = models.TextField(blank=True, default="")
    task_id = models.CharField(max_length=512, blank=True, default="")

    class Meta:
        ordering = ["job", "number", "id"]
        # The monitor's history and the 5-minute failure rate read time windows of the
        # log (selectors/history.py); without these every refresh scanned all of it.
        indexes = [
            models.Index(fields=["finished_at"], name="attempt_finished"),
            models.Index(fields=["started_at"], name="attempt_started"),
        ]

    def __str__(self):
        return f"attempt {self.number} of {self.job_id}: {self.outcome}"


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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "job_id", "output_index"]
        constraints = [models.UniqueConstraint(fields=["job", "output_index"], name="album_one_item_per_job_output")]
        indexes = [models.Index(fields=["owner"], name="album_owner")]

    def __str__(self):
        return f"{self.kind} #{self.output_index} of job {self.job_id}"


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
    """Liveness of our processes: worker clusters and queue services."""

    class Role(models.TextChoices):
        WORKER = "worker"
        QUEUE_SERVICE = "queue_service"

    name = models.CharField(max_length=200, unique=True)
    role = models.CharField(max_length=20, choices=Role.choices)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()

    def __str__(self):
        return self.name


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

    class Meta:
        ordering = ["-created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "sha256"], name="reference_one_file_per_content")]

    def __str__(self):
        return f"reference {self.sha256[:12]} of user {self.owner_id}"
