"""Provider families: one module each, looked up by family name (no if-chains)."""

import importlib

FAMILY_MODULES = {
    "demo": "queue_app.providers.demo",
    "openai": "queue_app.providers.openai",
    "google": "queue_app.providers.google",
    "runninghub": "queue_app.providers.runninghub",
    "civitai": "queue_app.providers.civitai",
    "replicate": "queue_app.providers.replicate",
}


def adapter_for(family: str):
    """The adapter module of a family; PermanentError for one that is not built."""
    from queue_app.providers.base import PermanentError

    path = FAMILY_MODULES.get(family)
    if path is None:
        raise PermanentError(f"unknown provider family {family!r}")
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name == path:
            raise PermanentError(f"provider family {family!r} has no adapter in this build") from None
        raise


def key_address(family: str, base_url: str) -> str:
    """Where a provider record's key is sent: its base URL, or its family's default. A
    stored key is only ever sent to the address it was saved for, so a change of this
    address (a new base URL, or another family) needs the key again."""
    if base_url:
        return base_url.rstrip("/")
    path = FAMILY_MODULES.get(family)
    return getattr(importlib.import_module(path), "DEFAULT_BASE", family) if path else family


def poll_seconds(family: str) -> float:
    """How often a detached task of `family` is checked: the default cycle
    (DETACHED_POLL_SECONDS, 30 s), or the family's own faster cadence (Civitai 5 s)."""
    from django.conf import settings

    from queue_app.providers.base import ProviderError

    default = float(settings.DETACHED_POLL_SECONDS)
    try:
        own = getattr(adapter_for(family), "POLL_SECONDS", None)
    except ProviderError:
        return default
    return min(float(own), default) if own else default


def call(request, fn, *args):
    """Call an adapter function (submit or check) so that nothing it reports can carry the
    provider's own key or secret into a stored reason, an event or a log line."""
    from queue_app.providers.base import Failed, ProviderError
    from queue_app.providers.crypto import redact

    secrets = (request.api_key, request.api_secret)
    try:
        result = fn(*args)
    except ProviderError as error:
        error.reason = redact(error.reason, secrets)
        error.args = (error.reason,)
        raise
    if isinstance(result, Failed):
        return Failed(reason=redact(result.reason, secrets), permanent=result.permanent)
    return result
