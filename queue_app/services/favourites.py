"""Favourites of the album (issue 29): an item's owner stars it, or takes the star off."""

from queue_app.models import AlbumItem
from queue_app.services.errors import ServiceError


def album_favourite_set(*, user, item_id: int, favourite: bool) -> AlbumItem:
    item = AlbumItem.objects.filter(id=item_id, owner=user).first()
    if item is None:
        raise ServiceError("album item not found", 404, field="item_id")
    AlbumItem.objects.filter(id=item.id).update(favourite=favourite)
    item.favourite = favourite
    return item
