"""The private hosts staff allow for ComfyUI instances (ComfyAllowedHost), as net.py's
allowlist for the "comfyui" purpose (registered in apps.py). Everything else keeps the SSRF
guard: provider calls, downloads and push sends never consult this list.

Read on every check from sync code, so a change takes effect at once. The instance's
WebSocket connects from an event loop, where the database cannot be read: it uses the
list as last read in this process (every HTTP call to the instance reads it first).
"""

import asyncio
from urllib.parse import urlsplit

from queue_app.providers import net

PURPOSE = "comfyui"
WHERE = "ComfyUI → Allowed hosts (/comfy/allowed-hosts/, or in the admin)"

_last: list[str] = []


def entries() -> list[str]:
    global _last
    try:
        asyncio.get_running_loop()
        return list(_last)
    except RuntimeError:
        pass
    from comfy_app.models import ComfyAllowedHost

    try:
        _last = [host.entry() for host in ComfyAllowedHost.objects.all()]
    except Exception:  # no database at hand (a hiccup, a test without one): the list as last read
        return list(_last)
    return list(_last)


def normalise(address: str) -> tuple[str, bool | None]:
    """("host[:port]", http?) from what a person pastes: "http://192.168.1.20:8188/",
    "192.168.1.20:8188", "localhost". http? is None when no scheme was given."""
    text = (address or "").strip()
    scheme = None
    if "://" in text:
        parts = urlsplit(text)
        scheme = parts.scheme.lower() == "http"
        host, port = (parts.hostname or "").lower(), parts.port
    else:
        parts = urlsplit("//" + text)
        host, port = (parts.hostname or "").lower(), parts.port
    if not host:
        raise ValueError("give a host name or address, optionally with :port")
    return (f"{host}:{port}" if port else host), scheme


def refusal(error: net.UnsafeURL) -> str:
    """The message for a refused ComfyUI address: what, and where to allow it."""
    where = f"A local or private instance must first be allowed by staff under {WHERE}"
    return f"the ComfyUI address is not allowed: {error}. {where}"


def register() -> None:
    net.register_allowlist(PURPOSE, entries)
