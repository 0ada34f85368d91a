"""The edge: no request body or WebSocket message is read past its bound, signed in or not.

- `BodyLimit`, an ASGI middleware around the whole application (remixstudio/asgi.py):
  a body whose Content-Length is over the route's bound is answered 413 before a byte of
  it is read; one that streams past it (chunked, or lying about its length) is cut off
  there with 413. WebSocket messages over limits.WEBSOCKET_MESSAGE_BYTES close the socket
  (1009, "message too big").
- The bound of a route (`limit_for`): limits.UPLOAD_BYTES plus the form fields for the few
  routes that take reference images, limits.BODY_BYTES for every other.
- Under daphne (`remixstudio.daphne_edge`), the same bounds hold one layer lower: daphne
  (Twisted) would otherwise take the whole body, parse a multipart one in memory and queue
  all of it for the application at once, before any middleware runs.

Django's own bounds (settings.py, from limits.py) then apply inside.
"""

import json

from django.urls import Resolver404, resolve

from queue_app import limits

# The routes that take reference images as files (by URL name): the draft forms and the
# API's upload. The ComfyUI settings form's workflow file fits the ordinary bound.
UPLOAD_ROUTES = {"project_drafts", "draft_edit", "api_references"}
CHUNK = 64 * 1024  # a lazily read body (daphne_edge) is handed over in pieces of this size
BODY_FILE = "remixstudio.body_file"  # daphne_edge's message key: the body's file, read here


class TooLarge(Exception):
    pass


def limit_for(path: str) -> int:
    """The most bytes a request body to `path` may have."""
    try:
        name = resolve(path).url_name
    except Resolver404:
        return limits.BODY_BYTES
    return limits.UPLOAD_BYTES + limits.FORM_BYTES if name in UPLOAD_ROUTES else limits.BODY_BYTES


def refusal(path: str, limit: int, declared: int | None = None) -> tuple[bytes, bytes]:
    """(content type, body) of the 413: JSON for the API and MCP, text for pages."""
    said = f"the request body is {declared} bytes" if declared is not None else "the request body is too large"
    message = f"{said}; the limit here is {limit} bytes"
    if path.startswith(("/api/", "/mcp")):
        return b"application/json", json.dumps({"error": message}).encode()
    return b"text/plain; charset=utf-8", message.encode()


def declared_length(headers) -> int | None:
    """The Content-Length of ASGI headers; -1 for one that is not a number."""
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.strip().isdigit() else -1
    return None


class BodyLimit:
    """ASGI middleware: request bodies and WebSocket messages bounded before they are read."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self.app(scope, _bounded_messages(receive, send), send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope, receive, send):
        limit = limit_for(scope["path"])
        declared = declared_length(scope.get("headers", []))
        if declared is not None and (declared < 0 or declared > limit):
            await _refuse(send, scope["path"], limit, declared if declared >= 0 else None)
            return
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, _bounded_body(receive, limit), sending)
        except TooLarge:
            if not started:
                await _refuse(send, scope["path"], limit)


def _bounded_body(receive, limit: int):
    """`receive`, counting body bytes (TooLarge past `limit`); a daphne_edge body file is
    read from here in CHUNK pieces as the application asks, never queued whole."""
    state = {"total": 0, "file": None, "at": 0}

    async def bounded():
        if state["file"] is not None:
            message = _from_file(state)
        else:
            message = await receive()  # after the body: what daphne says next (a disconnect)
            if message.get(BODY_FILE) is not None:
                state["file"] = message[BODY_FILE]
                message = _from_file(state)
        if message["type"] == "http.request":
            state["total"] += len(message.get("body", b""))
            if state["total"] > limit:
                raise TooLarge()
        return message

    return bounded


def _from_file(state) -> dict:
    handle = state["file"]
    try:
        handle.seek(state["at"])
        chunk = handle.read(CHUNK)
    except (OSError, ValueError):  # the connection went and Twisted closed the file
        return {"type": "http.disconnect"}
    state["at"] += len(chunk)
    if len(chunk) < CHUNK:
        state["file"] = None  # the whole body is handed over: back to daphne's queue
    return {"type": "http.request", "body": chunk, "more_body": len(chunk) == CHUNK}


async def _refuse(send, path: str, limit: int, declared: int | None = None) -> None:
    content_type, body = refusal(path, limit, declared)
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _bounded_messages(receive, send):
    """`receive` of a WebSocket: a message over the bound closes the socket (1009)."""

    async def bounded():
        message = await receive()
        if message["type"] == "websocket.receive":
            size = len(message.get("bytes") or b"") + len((message.get("text") or "").encode())
            if size > limits.WEBSOCKET_MESSAGE_BYTES:
                await send({"type": "websocket.close", "code": 1009})
                return {"type": "websocket.disconnect", "code": 1009}
        return message

    return bounded
