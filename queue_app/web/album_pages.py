"""Album actions: delete one item (owner only, confirmed), download a project's album.

Delete: GET shows what goes and how much storage it frees; POST with `confirm=1` deletes
through `album_item_delete`. The zip is streamed (web/album_zip.py).
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, StreamingHttpResponse
from django.shortcuts import redirect, render

from queue_app.models import AlbumItem, Project
from queue_app.selectors.jobs import album_grouped, album_zip_items
from queue_app.services.errors import ServiceError
from queue_app.services.storage import album_item_delete
from queue_app.sizes import human_bytes
from queue_app.web import album_zip
from queue_app.web.shortcuts import own


@login_required
def album_delete(request, item_id):
    item = own(AlbumItem, request.user, id=item_id)
    if item.owner_id != request.user.id:
        raise Http404("not found")  # staff may look at anyone's album, only the owner deletes
    if request.method == "POST" and request.POST.get("confirm") == "1":
        try:
            freed = album_item_delete(user=request.user, item_id=item.id)
            messages.success(request, f"album item deleted; {human_bytes(freed)} freed")
        except ServiceError as error:
            messages.error(request, error.message)
        return redirect(f"/projects/{item.project_id}/#album")
    return render(request, "queue_app/album_delete.html", {"item": item, "groups": album_grouped([item])})


@login_required
def album_download(request, project_id):
    project = own(Project, request.user, id=project_id)
    chunks = album_zip.zip_chunks(album_zip_items(project))
    response = StreamingHttpResponse(album_zip.streamed(request, chunks), content_type="application/zip")
    name = "".join(c if c.isalnum() else "-" for c in project.name)[:60] or "album"
    response["Content-Disposition"] = f'attachment; filename="{name}-album.zip"'
    response["X-Content-Type-Options"] = "nosniff"
    return response
