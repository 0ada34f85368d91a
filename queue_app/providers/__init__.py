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
