"""The next moment queued work becomes runnable on its own: a provider's 429 cool-down
ends, or a retry's backoff (`not_before`) passes.

The queue service dispatches at that moment (to ~100 ms) instead of waiting for the 3 s
safety net, which stays as the net for everything this does not see. Two indexed MIN
queries; the service re-reads them a few times a second so cool-downs and backoffs that
workers write meanwhile are learnt in time. Resumes, raised limits and freed slots wake
dispatch directly (services and transitions); they need no schedule.
"""

from datetime import datetime

from django.db.models import Min

from queue_app.engine import runner_registry
from queue_app.models import Job, Provider, Status


def next_moment(now: datetime) -> datetime | None:
    """The earliest cool-down end or backoff end after `now`, or None."""
    # Few providers are ever cooling down: a wake for one with nothing queued costs one
    # safety-net pass, cheaper than joining the jobs table here.
    cooldown = Provider.objects.filter(paused=False, cooldown_until__gt=now).aggregate(at=Min("cooldown_until"))["at"]
    backoff = (
        Job.objects.filter(status=Status.PENDING, not_before__gt=now)
        .exclude(project__kind__in=runner_registry.kinds())
        .aggregate(at=Min("not_before"))["at"]
    )
    moments = [m for m in (cooldown, backoff) if m is not None]
    return min(moments) if moments else None
