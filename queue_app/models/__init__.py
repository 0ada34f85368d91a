"""The data model of queue_app, one module per role:

- `choices` — provider families, project kinds, job statuses, error classes;
- `queue` — provider records, projects, jobs and the append-only attempt log (and the
  per-user storage limit);
- `album` — album items and uploaded reference images;
- `events` — the live-event outbox and process heartbeats;
- `access` — API tokens and idempotency keys;
- `notifications` — VAPID keys, push subscriptions, project runs and the push outbox;
- `batches` — projects' workflows, users' wildcard lists and prompt templates (the combinations generator);
- `tallies` — the counts of deleted attempts, kept for the history and /metrics.

A job's `status` is never assigned here or anywhere but `queue_app.engine.transitions`.
Everything is imported here, so `from queue_app.models import Job` works as before and the
migrations' references (`queue_app.models.album_upload_to`) still resolve.
"""

from queue_app.models.access import ApiToken, IdempotencyKey
from queue_app.models.album import AlbumItem, Reference, album_upload_to, reference_upload_to
from queue_app.models.batches import ProjectWorkflow, PromptTemplate, WildcardList
from queue_app.models.choices import ErrorClass, Family, Kind, Status
from queue_app.models.events import EventCounter, Heartbeat, ProjectEvent
from queue_app.models.ledger import Charge
from queue_app.models.notifications import ProjectRun, PushOutbox, PushSubscription, VapidKeys
from queue_app.models.queue import AccountSettings, Job, JobAttempt, JobQuerySet, Project, Provider, ShareTurn, fence
from queue_app.models.tallies import AttemptTally, AttemptTotal, RollupMark

__all__ = [
    "AccountSettings",
    "AlbumItem",
    "ApiToken",
    "AttemptTally",
    "AttemptTotal",
    "Charge",
    "ErrorClass",
    "EventCounter",
    "fence",
    "Family",
    "Heartbeat",
    "IdempotencyKey",
    "Job",
    "JobAttempt",
    "JobQuerySet",
    "Kind",
    "Project",
    "ProjectEvent",
    "ProjectRun",
    "ProjectWorkflow",
    "PromptTemplate",
    "Provider",
    "PushOutbox",
    "PushSubscription",
    "Reference",
    "RollupMark",
    "ShareTurn",
    "Status",
    "VapidKeys",
    "WildcardList",
    "album_upload_to",
    "reference_upload_to",
]
