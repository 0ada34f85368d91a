"""The album to find things in (`/album/`): every project's outputs filtered by project,
provider, model, kind, date, favourites and prompt words, 48 a page by key; a star per
item. Thin: the query string parsed into selectors.album_search.AlbumFilter."""

from datetime import date

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from queue_app.models import AlbumItem, Project, Provider
from queue_app.selectors.album_search import AlbumFilter, album_page
from queue_app.selectors.visibility import visible_to
from queue_app.services.errors import ServiceError
from queue_app.services.favourites import album_favourite_set
from queue_app.web.shortcuts import own


def _number(value: str) -> int | None:
    value = (value or "").strip()
    return int(value) if value.isdigit() and len(value) < 19 else None


def _day(value: str) -> date | None:
    try:
        return date.fromisoformat((value or "").strip())
    except ValueError:
        return None


def filter_of(query) -> AlbumFilter:
    """What the form asked for; a value that does not parse is left out, not an error."""
    kind = query.get("kind", "")
    return AlbumFilter(
        project=_number(query.get("project", "")),
        provider=_number(query.get("provider", "")),
        model=query.get("model", "").strip()[:200],
        kind=kind if kind in AlbumItem.ItemKind.values else "",
        since=_day(query.get("since", "")),
        until=_day(query.get("until", "")),
        favourite=query.get("favourite") in ("1", "on", "true"),
        words=query.get("q", "").split()[:8],
    )


@login_required
def album_browse(request):
    wanted = filter_of(request.GET)
    page = album_page(request.user, wanted, before=_number(request.GET.get("before", "")))
    kept = request.GET.copy()
    kept.pop("before", None)
    context = {
        **page,
        "wanted": wanted,
        "query": request.GET,
        "kept": kept.urlencode(),
        "projects": visible_to(request.user, Project).order_by("name").only("id", "name"),
        "providers": visible_to(request.user, Provider).order_by("name").only("id", "name"),
        "kinds": AlbumItem.ItemKind.values,
    }
    return render(request, "queue_app/album_browse.html", context)


@login_required
@require_POST
def album_favourite(request, item_id: int):
    item = own(AlbumItem, request.user, id=item_id)  # another user's: 404
    try:
        album_favourite_set(user=request.user, item_id=item.id, favourite=request.POST.get("favourite") == "1")
    except ServiceError as refusal:  # staff see others' items; only an owner stars them
        raise PermissionDenied(refusal.message) from None
    back = request.POST.get("next", "")
    return redirect(back if url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}) else "album_browse")
