"""The one small interface every provider family implements.

An adapter module exposes:

    submit(job: ResolvedJob) -> Finished | Submitted
    check(task_id: str, job: ResolvedJob) -> Running | Finished | Failed
    POLL_SECONDS: float | None # how often a detached task of this family is checked
                               # (None: the default cycle, DETACHED_POLL_SECONDS = 30 s)
    STATUS_PER_MINUTE: int | None  # documented status requests a minute (None: not
                               # published; providers/budget.py picks a default)
    check_page(cursor, job) -> ({task_id: Running}, next_cursor)  # optional, with
                               # STATUS_BATCH: many tasks a request (Replicate's list)
    cancel(task_id: str, job: ResolvedJob) -> None   # optional: stop a remote task;
                               # a refusal is only logged
    find_submitted(job, tag, since) -> [task_id, …]  # optional: what an earlier
                               # attempt (`tag`, after `since`) created (engine/reconcile)

and raises PermanentError, TransientError or AmbiguousError. Adapters know nothing of
Django or the queue: a ResolvedJob in, outputs or a task id out.
"""

from dataclasses import dataclass, field


class ProviderError(Exception):
    """Base of the three failure classes; `error_class` is what the queue branches on."""

    error_class = "transient"

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class PermanentError(ProviderError):
    """Validation, auth, content policy, model gone: retrying as-is cannot help."""

    error_class = "permanent"


class AccountError(PermanentError):
    """The account, not the job, is at fault: a rejected key, no credit, billing off.
    Every job sent now would fail the same way, so the queue pauses the provider (with
    this reason) and puts the job back, instead of failing the whole queue one by one."""


class TransientError(ProviderError):
    """Worth retrying. `delay` is the server's own hint (Retry-After, RetryInfo) in seconds;
    a hinted delay cools the whole provider down instead of spending the job's attempts."""

    error_class = "transient"

    def __init__(self, reason: str, delay: float | None = None):
        super().__init__(reason)
        self.delay = delay


class AmbiguousError(ProviderError):
    """The request may have been accepted (timeout after the body was sent)."""

    error_class = "ambiguous"


@dataclass(frozen=True)
class Output:
    kind: str  # image | video | audio | text
    data: bytes | None = None
    url: str | None = None
    text: str | None = None
    content_type: str = ""
    role: str = "main"  # main | composite | layer
    width: int | None = None
    height: int | None = None
    poster: bytes | None = None  # a video's poster frame, when it was cheap to get
    poster_url: str | None = None  # or where to fetch it (a failed poster fetch is not a failure)
    headers: dict = field(default_factory=dict)  # sent with the download of `url`


@dataclass(frozen=True)
class Finished:
    outputs: list
    # What the provider reported it billed, as it said it (docs/money.md): input_tokens and
    # output_tokens, predict_time (seconds), or charged with its currency (Buzz, coins).
    usage: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Submitted:
    task_id: str


@dataclass(frozen=True)
class Running:
    progress: float | None = None


@dataclass(frozen=True)
class Failed:
    reason: str
    # A dead task (canceled, expired, 404) against one that failed on its merits.
    permanent: bool = True


@dataclass(frozen=True)
class ResolvedJob:
    """Everything an adapter may know about a job: its snapshot plus the credentials."""

    job_id: str
    provider_id: int
    family: str
    kind: str
    model: str
    prompt: str
    references: list = field(default_factory=list)
    aspect_ratio: str = ""
    quality: str = ""
    resolution: str = ""
    format: str = ""
    background: str = ""
    duration: int | None = None
    sound: str = ""
    system_prompt: str = ""
    temperature: float | None = None
    max_tokens: int | None = None
    params: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    base_url: str = ""
    api_key: str = field(default="", repr=False)
    api_secret: str = field(default="", repr=False)
    # This attempt's unique tag, sent where the provider echoes it back (Civitai `tags`),
    # so a later attempt can find the task this one may have created (engine/reconcile.py).
    tag: str = ""
