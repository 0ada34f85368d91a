"""Album outputs for programs: `GET /api/album` (a page by key), `GET /api/album/<id>/file`
(the file, streamed) and `DELETE /api/album/<id>`.

The file answers the API token (or the session), or a short-lived signed URL with no
credentials at all (`?sig=`, DOWNLOAD_SECONDS): what an agent hands to a downloader that
cannot send headers. A signature names one item and the user it was made for, and is
checked against what that user may see now. Large files are streamed, never held in memory.
"""

from django.core import signing
from django.http import FileResponse, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from queue_app.models import AlbumItem
from queue_app.selectors.agents import album_before
from queue_app.selectors.visibility import visible_to
from queue_app.services.errors import ServiceError
from queue_app.services.storage import album_item_delete
from queue_app.web import album_files, api, cursors, refusals, schemas

DOWNLOAD_SECONDS = 15 * 60
_SALT = "queue_app.album-download"


def file_url(base_url: str, item_id: int) -> str:
    """The file's address for a client holding the API token (and the resource URI)."""
    return f"{base_url}/api/album/{item_id}/file"


def signed_url(base_url: str, user, item_id: int) -> str:
    """The same file for DOWNLOAD_SECONDS without credentials."""
    signature = signing.TimestampSigner(salt=_SALT).sign(f"{item_id}.{user.pk}")
    return f"{file_url(base_url, item_id)}?sig={signature}"


def with_links(base_url: str, user, item: dict) -> dict:
    """An album item (selectors.agents.album_json) with its file's links, when it has one."""
    has_file = item.pop("has_file")
    links = {"url": None, "download_url": None}
    if has_file or item["kind"] == "text":
        links = {"url": file_url(base_url, item["id"]), "download_url": signed_url(base_url, user, item["id"])}
    return {**item, **links}


def signer_user(signature: str, item_id: int):
    """The user a valid, unexpired signature for this item was made for, or None."""
    from django.contrib.auth import get_user_model

    try:
        value = signing.TimestampSigner(salt=_SALT).unsign(signature, max_age=DOWNLOAD_SECONDS)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    signed_item, _, user_id = value.partition(".")
    if signed_item != str(item_id) or not user_id.isdigit():
        return None
    return get_user_model().objects.filter(id=int(user_id), is_active=True).first()


def refused(refusal: ServiceError):
    described = refusals.describe(refusal)
    return api.answer({"error": refusal.message, **{k: v for k, v in described.items() if k != "message"}}, refusal.code)


@csrf_exempt
def album_file_view(request, item_id):
    if request.method not in ("GET", "HEAD"):
        response = refused(ServiceError(f"method {request.method} not allowed", 405))
        response["Allow"] = "GET, HEAD"
        return response
    if "sig" in request.GET:
        user = signer_user(request.GET["sig"], item_id)
        if user is None:
            return refused(ServiceError("this download link is invalid or has expired; ask for a new one", 403))
    else:
        user, refusal = api.authenticate(request)
        if refusal is not None:
            return refusal
    item = visible_to(user, AlbumItem).filter(id=item_id).first()
    if item is None or not (item.file or item.kind == AlbumItem.ItemKind.TEXT):
        return refused(ServiceError("album item not found", 404, field="item_id"))
    if item.kind == AlbumItem.ItemKind.TEXT:
        return album_files.harden(HttpResponse(item.text), "text/plain")
    response = FileResponse(item.file.open("rb"))  # streamed in blocks; Content-Length from the file
    return album_files.harden(response, item.content_type, filename=f"album-{item.id}")


def album_page(user, base_url: str, *, project_id=None, cursor=None, limit=50) -> dict:
    """A page of album items newest first, each with its links; the API and MCP share it."""
    if project_id is not None:
        api.visible_project(user, project_id)
    result = album_before(user=user, project_id=project_id, before_id=cursors.after_id(cursor), limit=limit)
    last = result["next_before"]
    return {
        "items": [with_links(base_url, user, item) for item in result["items"]],
        "nextCursor": cursors.id_cursor(last) if last else None,
    }


@api.endpoint("GET")
def album_list_view(request, body):
    query = schemas.validate_query(schemas.AlbumQuery, request.GET)
    base = f"{request.scheme}://{request.get_host()}"
    return api.answer(album_page(request.user, base, project_id=query.project_id, cursor=query.cursor, limit=query.limit))


@api.endpoint("DELETE")
def album_item_view(request, body, item_id):
    return api.answer({"deleted": True, "freed": album_item_delete(user=request.user, item_id=item_id)})
