"""The words of the domain as database choices: provider families, project kinds, job
statuses and why a job failed."""

from django.db import models


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
