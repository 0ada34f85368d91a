"""What a provider's answers do to the provider record itself, not to one job: a rate
limit cools it down, an account problem pauses it. Dispatch reads both."""

import logging
from datetime import timedelta

from django.db.models import F
from django.db.models.functions import Greatest, Now

from queue_app.models import Provider

log = logging.getLogger(__name__)


def cool_down(provider_id: int, seconds: float) -> None:
    """A provider that answered 429 with a delay dispatches nothing until it passes."""
    until = Now() + timedelta(seconds=seconds)
    Provider.objects.filter(id=provider_id, cooldown_until__isnull=True).update(cooldown_until=until)
    Provider.objects.filter(id=provider_id, cooldown_until__isnull=False).update(
        cooldown_until=Greatest(F("cooldown_until"), until)
    )


def pause_for_account(provider: Provider, reason: str) -> None:
    """A rejected key, no credit: pause the provider with the reason a person must act on.
    Dispatch stops; detached tasks already paid for are still polled."""
    reason = reason[:300]
    # Every poll of the provider's detached tasks may report the same problem: write and
    # log it once.
    changed = (
        Provider.objects.filter(id=provider.id)
        .exclude(paused=True, paused_reason=reason)
        .update(paused=True, paused_reason=reason)
    )
    if changed:
        log.warning("provider %s paused: account problem reported by %s", provider.id, provider.family)
