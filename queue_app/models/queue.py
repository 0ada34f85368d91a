"""The queue's tables: provider records, projects, jobs and the append-only attempt log.

A job's `status` is never assigned here or anywhere but `queue_app.engine.transitions`.
"""

import uuid

from django.conf import settings
from django.core.validators import MaxLengthValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce

from queue_app import limits
from queue_app.models.choices import ErrorClass, Family, Kind, Status
from queue_app.providers import crypto


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

    api_key = crypto.encrypted("api_key_encrypted")

    @api_key.setter  # the same, and the hint the pages show
    def api_key(self, value: str) -> None:
        self.api_key_encrypted = crypto.encrypt(value)
        self.api_key_hint = value[-4:] if len(value) >= 8 else ""

    api_secret = crypto.encrypted("api_secret_encrypted")


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
    # Its share of a provider's slots beside other projects with pending work there
    # (engine/fair_share.py): a project of weight 2 may hold twice the slots of one of 1.
    share_weight = models.PositiveIntegerField(default=1, validators=[limits.SHARE_WEIGHT.validator()])
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(share_weight__gte=limits.SHARE_WEIGHT.low, share_weight__lte=limits.SHARE_WEIGHT.high),
                name="project_share_weight_within_limit",
            ),
        ]

    def __str__(self):
        return self.name


class ShareTurn(models.Model):
    """When a provider last gave a slot to a project while others waited too: fair share
    takes turns among equally served projects, the longest unserved first. Plain ids, no
    constraint: a claim writes these rows last, and nothing that deletes a project or a
    provider waits for them (a stale row is harmless)."""

    provider = models.ForeignKey(Provider, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+")
    served_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "project"], name="share_turn_provider_project")]

    def __str__(self):
        return f"turn of project {self.project_id} on provider {self.provider_id}"


class JobQuerySet(models.QuerySet):
    def fenced(self, job_id, token):
        """The job while it is processing under the lease `token`. Every write of an
        execution filters through this: a write that matches no row means the job was
        taken from its worker (healed, cleared, retried), which then writes nothing."""
        return self.filter(**fence(job_id, token))


def fence(job_id, token) -> dict:
    """The lookups of `fenced`, for the hot path's written-out statements (engine/hot_sql.py)."""
    return dict(id=job_id, lease_token=token, status=Status.PROCESSING)


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
    # "Run next": set, the pending job goes before every other of its provider's (earliest
    # set first), within the provider's limit, cool-down and its own backoff; cleared at claim.
    run_next_at = models.DateTimeField(null=True, blank=True)
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
            # The head of each queue a claim reads (engine/fair_share.py): a provider's own
            # pending jobs per project, and a project's that name no provider, in order.
            models.Index(
                fields=["provider", "project", "queued_at", "created_at", "id"],
                condition=Q(status="pending"),
                name="job_pending_provider_order",
            ),
            models.Index(
                fields=["project", "queued_at", "created_at", "id"],
                condition=Q(status="pending", provider__isnull=True),
                name="job_pending_project_order",
            ),
            # The jobs moved to the front ("run next"): a few rows among the pending ones.
            models.Index(
                fields=["run_next_at"],
                condition=Q(status="pending", run_next_at__isnull=False),
                name="job_pending_run_next",
            ),
            models.Index(fields=["active_provider", "status"], name="job_active_provider"),
            models.Index(fields=["provider", "status"], name="job_provider_status"),
            models.Index(fields=["project", "status"], name="job_project_status"),
            models.Index(fields=["owner", "status"], name="job_owner_status"),
            models.Index(fields=["status", "next_poll_at"], name="job_status_poll"),
            models.Index(fields=["status", "lease_expires_at"], name="job_status_lease"),
            # the Queue Monitor's job list, newest first, reads this index backwards
            models.Index(fields=["created_at", "id"], name="job_created"),
            # the monitor's "held for attention" list and count: a few rows among the
            # failed ones, newest first, without reading every failed job
            models.Index(fields=["error_class", "status", "finished_at"], name="job_attention"),
            # queue_status's one grouped count (monitor, status API, metrics): every column
            # it reads, only for the jobs it counts, so PostgreSQL answers from the index
            # alone (an index-only scan) instead of visiting a heap page per open job.
            models.Index(
                fields=["owner", "status", "project", "provider", "active_provider"],
                include=["task_id", "lease_expires_at", "not_before", "queued_at", "updated_at"],
                condition=Q(status__in=["pending", "processing", "failed"]),
                name="job_open_counts",
            ),
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
    """One row per provider call of a job, numbered 1, 2, 3 across its retries and heals.
    A detached task's submit and its later collection are phases of one attempt: the row
    is open (no `finished_at`) until the attempt's outcome is final."""

    class Phase(models.TextChoices):
        SUBMIT = "submit"  # a worker calls the provider (the whole of a synchronous call)
        REMOTE = "remote"  # the task runs at the provider; the poller (or a runner) checks it
        COLLECT = "collect"  # a worker fetches the finished task's result

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
    phase = models.CharField(max_length=8, choices=Phase.choices, default=Phase.SUBMIT)
    detached_at = models.DateTimeField(null=True, blank=True)  # the submit phase's end: the task id was stored
    collecting_at = models.DateTimeField(null=True, blank=True)  # a worker began to collect the result
    reason = models.TextField(blank=True, default="")
    task_id = models.CharField(max_length=512, blank=True, default="")
    # Copied from the job when the attempt opens (`save`): the monitor's history, the
    # failure rates and /metrics then read a time window of this table alone. Joining the
    # jobs for them scanned every job on each refresh. No constraint: the log outlives a
    # deleted provider and keeps its id.
    provider = models.ForeignKey(
        Provider, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    queued_at = models.DateTimeField(null=True, blank=True)  # the job's, when this attempt opened

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

    def save(self, *args, **kwargs):
        if self._state.adding and self.owner_id is None and self.job_id:
            # the job's provider as the history names it (its own, else its project's)
            origin = (
                Job.objects.filter(id=self.job_id)
                .values_list(Coalesce("provider_id", "project__provider_id"), "owner_id", "queued_at")
                .first()
            )
            if origin:
                self.provider_id, self.owner_id, self.queued_at = origin
        super().save(*args, **kwargs)
