"""The words of the domain as database choices: provider families, project kinds, job
statuses and why a job failed."""

from django.db import models


class Family(models.TextChoices):
    # The labels are the families' own names, said this way on every page and form
    # (templatetags `family_name`, `kind_name`).
    DEMO = "demo", "Demo"
    OPENAI = "openai", "OpenAI"
    GOOGLE = "google", "Gemini"
    RUNNINGHUB = "runninghub", "RunningHub"
    CIVITAI = "civitai", "Civitai"
    REPLICATE = "replicate", "Replicate"


class Kind(models.TextChoices):
    IMAGE = "image", "Image"
    VIDEO = "video", "Video"
    TEXT = "text", "Text"
    AUDIO = "audio", "Audio"
    COMFYUI = "comfyui", "ComfyUI"


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
