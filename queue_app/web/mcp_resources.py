"""MCP resources: every album output as `<base>/api/album/<id>/file`, the same address a
tool's resource_link and `get_job`'s `url` carry. `resources/read` answers its bytes
(base64 `blob`) or text; a file over INLINE_BYTES is not inlined: the answer is its
short-lived signed download URL (`text/uri-list`), which streams it. `resources/list` pages
the album newest first by key; one template names any item."""

import base64
import re

from queue_app.models import AlbumItem
from queue_app.selectors.visibility import visible_to
from queue_app.services.errors import ServiceError
from queue_app.web import album_api

INLINE_BYTES = 8 * 2**20
URI = re.compile(r"^(?:https?://[^/]+)?/api/album/(\d{1,18})/file(?:\?.*)?$")


def templates(base_url: str) -> dict:
    return {
        "resourceTemplates": [
            {
                "uriTemplate": f"{base_url}/api/album/{{item_id}}/file",
                "name": "album_file",
                "title": "An album output",
                "description": "The file (or text) of one album item; item ids come from get_job outputs and list_album.",
            }
        ]
    }


def listing(user, base_url: str, params: dict) -> dict:
    cursor = params.get("cursor")
    if cursor is not None and not isinstance(cursor, str):
        raise ServiceError("cursor must be a string", field="cursor")
    page = album_api.album_page(user, base_url, cursor=cursor)
    resources = [
        {
            "uri": item["url"],
            "name": f"album-{item['id']}",
            "title": f"output {item['index']} of job {(item['job_id'] or '')[:8]}".strip(),
            "mimeType": item["content_type"] or "text/plain",
            "size": item["size"],
        }
        for item in page["items"]
        if item["url"]
    ]
    return {"resources": resources, **({"nextCursor": page["nextCursor"]} if page["nextCursor"] else {})}


def read(user, base_url: str, params: dict) -> dict:
    uri = params.get("uri")
    match = URI.match(uri) if isinstance(uri, str) else None
    item = visible_to(user, AlbumItem).filter(id=int(match.group(1))).first() if match else None
    if item is None or not (item.file or item.kind == AlbumItem.ItemKind.TEXT):
        raise ServiceError(f"resource not found: {str(uri)[:200]}", 404, field="uri")
    if item.kind == AlbumItem.ItemKind.TEXT:
        return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": item.text}]}
    if item.size > INLINE_BYTES:
        link = album_api.signed_url(base_url, user, item.id)
        meta = {"size": item.size, "mimeType": item.content_type, "expiresIn": album_api.DOWNLOAD_SECONDS}
        return {"contents": [{"uri": uri, "mimeType": "text/uri-list", "text": link, "_meta": meta}]}
    with item.file.open("rb") as handle:
        data = handle.read(INLINE_BYTES + 1)
    mime = item.content_type or "application/octet-stream"
    return {"contents": [{"uri": uri, "mimeType": mime, "blob": base64.b64encode(data).decode()}]}


def handle(method: str, user, base_url: str, params: dict) -> dict:
    if method == "resources/templates/list":
        return templates(base_url)
    if method == "resources/list":
        return listing(user, base_url, params)
    return read(user, base_url, params)
