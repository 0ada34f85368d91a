"""Provider records: create, edit, pause, concurrency, cool-down and delete."""

import logging

from django.db import transaction
from django.db.models import Q

from queue_app import limits
from queue_app.engine import budgets, dispatch
from queue_app.models import Job, Project, Provider, Status
from queue_app.providers.catalogue import CATALOGUE
from queue_app.selectors.visibility import may_act, visible_to
from queue_app.services.acting import acting_on
from queue_app.services.errors import ServiceError, refuse_unknown

log = logging.getLogger(__name__)


def provider_may_change(user, provider: Provider) -> bool:
    """Staff may see every provider, but changing another user's (or testing its key)
    needs the Django change permission: `is_staff` alone must not redirect someone's key."""
    return may_act(user, provider)


def _own_provider(user, provider_id) -> Provider:
    provider = visible_to(user, Provider).filter(id=provider_id).first()
    if provider is None:
        raise ServiceError("provider not found", 404, field="provider_id")
    return acting_on(user, provider, noun="provider")


def provider_test_key(*, user, provider_id) -> dict:
    """Test a provider's stored key at its stored address (providers/keycheck.py). Using a
    key is acting on it: another user's needs the change permission, like editing it."""
    from queue_app.providers import keycheck

    provider = _own_provider(user, provider_id)
    return {"id": provider.id, **keycheck.test_key(provider)}


def provider_set_paused(*, user, provider_id, paused: bool) -> Provider:
    provider = _own_provider(user, provider_id)
    Provider.objects.filter(id=provider.id).update(paused=paused, paused_reason="")
    log.info("provider %s %s by user %s", provider.id, "paused" if paused else "resumed", user.pk)
    if not paused:
        transaction.on_commit(lambda: dispatch.wake(provider_ids={provider.id}))
    provider.paused = paused
    return provider


def provider_set_concurrency(*, user, provider_id, concurrency) -> Provider:
    """Takes effect at once for new dispatches. Lowering it never cancels running or
    detached work: the extra jobs finish and their slots are not refilled."""
    concurrency = concurrency_checked(concurrency)
    provider = _own_provider(user, provider_id)
    Provider.objects.filter(id=provider.id).update(concurrency=concurrency)
    log.info("provider %s concurrency %s → %s by user %s", provider.id, provider.concurrency, concurrency, user.pk)
    if concurrency > provider.concurrency:
        transaction.on_commit(lambda: dispatch.wake(provider_ids={provider.id}))
    provider.concurrency = concurrency
    return provider


def provider_clear_cooldown(*, user, provider_id) -> Provider:
    provider = _own_provider(user, provider_id)
    Provider.objects.filter(id=provider.id).update(cooldown_until=None)
    transaction.on_commit(lambda: dispatch.wake(provider_ids={provider.id}))
    return provider


PROVIDER_FIELDS = ("name", "family", "base_url", "api_key", "api_secret", "concurrency", "max_attempts", "paused", "options")


PROVIDER_FIELDS += ("model_aliases",)


def concurrency_checked(value) -> int:
    """The one check of a provider's concurrency (page, API, admin, MCP), against the
    declared limit in queue_app/limits.py, in words a person can act on."""
    bounds = limits.CONCURRENCY
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServiceError(f"concurrency must be a whole number from {bounds.low} to {bounds.high}")
    if value < bounds.low:
        raise ServiceError("concurrency must be at least 1: to stop new work, pause the provider instead")
    if value > bounds.high:
        raise ServiceError(
            f"concurrency can be at most {bounds.high} jobs at once per provider"
            f" (a whole number from {bounds.low} to {bounds.high})"
        )
    return value


def base_url_checked(url) -> str:
    """A provider's base URL override: blank, or an address outbound calls may reach.
    The one home of this check (the provider page, the API and the admin use it)."""
    from queue_app.providers import net

    if url in (None, ""):
        return ""
    if not isinstance(url, str) or len(url) > 200:
        raise ServiceError("the base URL must be a URL of at most 200 characters")
    try:
        return net.validate_base_url(url.strip())
    except ValueError as error:
        raise ServiceError(f"base URL: {error}") from None


def aliases_checked(family: str, aliases) -> dict:

    if not isinstance(aliases, dict) or len(aliases) > 100:
        raise ServiceError("model aliases must be an object of at most 100 alias → model pairs")
    models = CATALOGUE.get(family, {})
    cleaned = {}
    for alias, model in aliases.items():
        if not isinstance(alias, str) or not alias.strip() or len(alias) > 200 or not isinstance(model, str):
            raise ServiceError("each model alias needs a name (at most 200 characters) and a model")
        if models and model not in models:
            raise ServiceError(f"alias {alias!r}: {model!r} is not a {family} model (one of {', '.join(models)})")
        cleaned[alias.strip()] = model
    return cleaned


def key_moves(provider: Provider, values: dict) -> bool:
    """Whether `values` would send the provider's key somewhere else than it was saved for."""
    from queue_app.providers import key_address

    before = key_address(provider.family, provider.base_url)
    return key_address(values.get("family", provider.family), values.get("base_url", provider.base_url)) != before


def provider_values(*, user, data: dict, provider: Provider | None = None) -> dict:
    """The provider fields in `data`, checked; nothing saved. Changing the base URL of a
    provider that exists needs its key again, so a stored key never follows a new address."""
    from queue_app.models import Family
    from queue_app.providers.options import clean_options

    refuse_unknown(data, PROVIDER_FIELDS)
    values = {}
    if "name" in data or provider is None:
        name = data.get("name")
        if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100:
            raise ServiceError("a provider needs a name of at most 100 characters")
        values["name"] = name.strip()
    if "family" in data or provider is None:
        if data.get("family") not in Family.values:
            raise ServiceError("family must be one of " + ", ".join(Family.values))
        values["family"] = data["family"]
    family = values.get("family", provider.family if provider else "")
    for secret in ("api_key", "api_secret"):
        if data.get(secret) not in (None, ""):
            if not isinstance(data[secret], str) or len(data[secret]) > 2000:
                raise ServiceError(f"{secret.replace('_', ' ')} must be text")
            values[secret] = data[secret].strip()
    if "base_url" in data:
        values["base_url"] = base_url_checked(data["base_url"])
    if provider is not None and key_moves(provider, values) and not values.get("api_key"):
        raise ServiceError(
            "to change the base URL or the family, enter the API key again (a stored key never follows a new address)"
        )
    if "concurrency" in data:
        values["concurrency"] = concurrency_checked(data["concurrency"])
    if "max_attempts" in data:
        value = data["max_attempts"]
        if isinstance(value, bool) or not isinstance(value, int) or not limits.MAX_ATTEMPTS.contains(value):
            raise ServiceError(limits.MAX_ATTEMPTS.message())
        values["max_attempts"] = value
    if "paused" in data:
        if not isinstance(data["paused"], bool):
            raise ServiceError("paused must be true or false")
        values["paused"] = data["paused"]
    if "options" in data or (provider is not None and family != provider.family):
        same_family = provider is not None and family == provider.family
        try:
            values["options"] = clean_options(family, data.get("options") or {}, keep=provider.options if same_family else {})
        except ValueError as error:
            raise ServiceError(str(error)) from None
    if "model_aliases" in data:
        values["model_aliases"] = aliases_checked(family, data["model_aliases"])
    return values


def provider_save(*, user, data: dict, provider: Provider | None = None) -> Provider:
    """Create a provider, or change one: every field is checked before anything is written
    (a refused request changes nothing). Concurrency and pause go through their services,
    which wake dispatch when they free capacity."""
    if provider is not None:
        provider = _own_provider(user, provider.id)
    values = provider_values(user=user, data=data, provider=provider)
    api_key, api_secret = values.pop("api_key", None), values.pop("api_secret", None)
    with transaction.atomic():
        if provider is None:
            provider = Provider(owner=user, **values)
            if api_key:
                provider.api_key = api_key
            if api_secret:
                provider.api_secret = api_secret
            provider.save()
            log.info("provider %s created by user %s", provider.id, user.pk)
            return provider
        concurrency, paused = values.pop("concurrency", None), values.pop("paused", None)
        if api_key:
            provider.api_key = api_key
            values.update(api_key_encrypted=provider.api_key_encrypted, api_key_hint=provider.api_key_hint)
        if api_secret:
            provider.api_secret = api_secret
            values["api_secret_encrypted"] = provider.api_secret_encrypted
        if "options" in values:
            refusal = budgets.below_reserved(provider.id, values["options"])
            if refusal:
                raise ServiceError(refusal)
            # a raised budget (or new prices) may let waiting jobs start: look at once
            transaction.on_commit(lambda: dispatch.wake(provider_ids={provider.id}))
        if values:
            Provider.objects.filter(id=provider.id).update(**values)
        if concurrency is not None and concurrency != provider.concurrency:
            provider_set_concurrency(user=user, provider_id=provider.id, concurrency=concurrency)
        if paused is not None and paused != provider.paused:
            provider_set_paused(user=user, provider_id=provider.id, paused=paused)
    log.info("provider %s changed by user %s: %s", provider.id, user.pk, sorted(set(values) | {"concurrency", "paused"}))
    return Provider.objects.get(id=provider.id)


def provider_work(provider: Provider) -> dict:
    """Jobs that still need this provider: pending (its own, or its projects' without a
    provider of their own) and processing (holding one of its slots)."""
    pending = (
        Job.objects.filter(status=Status.PENDING)
        .filter(Q(provider=provider) | Q(provider__isnull=True, project__provider=provider))
        .count()
    )
    processing = Job.objects.filter(status=Status.PROCESSING).filter(Q(active_provider=provider) | Q(provider=provider)).count()
    return {"pending": pending, "processing": processing}


def provider_delete(*, user, provider_id) -> dict:
    """Delete a provider. Refused while it has pending or processing work (pause it and
    let the work finish, or cancel it): deleting it would strand those jobs. Drafts and
    failed jobs that named it, and projects using it, are left without a provider."""
    from django.db.models import ProtectedError

    provider = _own_provider(user, provider_id)
    with transaction.atomic():
        # dispatch locks this row while it hands out slots: no job is claimed meanwhile
        Provider.objects.select_for_update().filter(id=provider.id).first()
        work = provider_work(provider)
        if work["pending"] or work["processing"]:
            raise ServiceError(
                f"{provider.name} still has {work['pending']} pending and {work['processing']} processing job(s): "
                "pause it and let them finish, or cancel them, then delete it",
                409,
                reason="busy",
                retriable=True,
            )
        projects = Project.objects.filter(provider=provider).count()
        try:
            provider.delete()
        except ProtectedError:
            raise ServiceError(
                f"{provider.name} is running a job; try again when it finishes", 409, reason="busy", retriable=True
            ) from None
    log.info("provider %s deleted by user %s", provider_id, user.pk)
    return {"deleted": True, "projects_without_provider": projects}
