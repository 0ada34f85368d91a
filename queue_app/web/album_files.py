"""How album files leave the server: never as something that can run in our origin.

An album file comes from a server a user chose. Even with its type read from its bytes
(engine/media.py), the response is hardened on its own, so a row stored before that check
— or a polyglot that is a valid image and a page at once — cannot run script:
- `X-Content-Type-Options: nosniff`: the browser takes the type we send, never guesses;
- `Content-Security-Policy: sandbox; default-src 'none'` (images and media of our own
  origin allowed, so a video or image opened on its own still plays): opened directly, the
  file is a sandboxed document with no script, no forms, no same-origin rights;
- a type outside the album's media types is sent as `application/octet-stream` with
  `Content-Disposition: attachment`: downloaded, never rendered.
"""

from queue_app.engine.media import ALBUM_TYPES

SANDBOX = "sandbox; default-src 'none'; img-src 'self'; media-src 'self'"


def harden(response, content_type: str, *, filename: str = "album-file"):
    """`response` with the headers above; `content_type` is what the item says it is."""
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = SANDBOX
    response["Cross-Origin-Resource-Policy"] = "same-origin"
    if content_type in ALBUM_TYPES:
        response["Content-Type"] = content_type + ("; charset=utf-8" if content_type.startswith("text/") else "")
        response.headers.pop("Content-Disposition", None)
    else:
        response["Content-Type"] = "application/octet-stream"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
