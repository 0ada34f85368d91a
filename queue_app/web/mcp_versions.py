"""Which protocol version a request speaks, and each answer shaped for it: a client that
negotiated an older version never meets a field or content type it does not know.

A client of 2025-06-18 or later names its version on every request (`MCP-Protocol-Version`).
An older one does not, so `initialize` hands it a session id that carries the negotiated
version, signed (stateless: nothing is stored), which it sends back on every request. A
request with neither (a script, curl) gets the full, latest answer.
"""

from django.core import signing

LATEST = "2025-11-25"
STRUCTURED = "2025-06-18"  # structuredContent, outputSchema, resource_link, titles
ANNOTATED = "2025-03-26"  # tool annotations
_SALT = "queue_app.mcp-session"


def session_for(version: str) -> str | None:
    """The Mcp-Session-Id to hand a client that negotiated `version` (None: it names its
    version on every request itself)."""
    return None if version >= STRUCTURED else signing.dumps({"v": version}, salt=_SALT, compress=True)


def version_of(request, supported) -> str | None:
    """The version this request speaks; None for a session id we did not give."""
    header = request.headers.get("MCP-Protocol-Version")
    if header:
        return header  # checked against `supported` at the door
    session = request.headers.get("Mcp-Session-Id")
    if not session:
        return LATEST
    try:
        version = signing.loads(session[:500], salt=_SALT)["v"]
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        return None
    return version if version in supported else None


def shaped(method: str, result, version: str):
    """`result` of `method` without what `version` does not define."""
    if version >= STRUCTURED or not isinstance(result, dict):
        return result
    if method == "tools/list":
        dropped = ("outputSchema", "title") if version >= ANNOTATED else ("outputSchema", "title", "annotations")
        return {**result, "tools": [{k: v for k, v in tool.items() if k not in dropped} for tool in result["tools"]]}
    if method == "tools/call":
        content = [item for item in result["content"] if item.get("type") != "resource_link"]
        return {**{k: v for k, v in result.items() if k != "structuredContent"}, "content": content}
    for key in ("resources", "resourceTemplates"):
        if key in result:
            return {**result, key: [{k: v for k, v in row.items() if k != "title"} for row in result[key]]}
    return result
