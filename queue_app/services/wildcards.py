"""Wildcards in a prompt: `{red|green|blue}` and named lists (`__colours__`, saved per
user) stand for one of their values. A prompt is parsed once into a `Template`; its
expansions are numbered like an odometer (the last wildcard turns fastest), so the n-th
expansion is computed without listing the others."""

import re
from dataclasses import dataclass

from django.db import transaction

from queue_app import limits
from queue_app.models import WildcardList
from queue_app.services.errors import ServiceError

NAMED = re.compile(r"__([A-Za-z0-9](?:[\w-]*[A-Za-z0-9])?)__")
NAME = re.compile(r"^[A-Za-z0-9](?:[\w-]*[A-Za-z0-9])?$")
VALUE_CHARS = 2000


@dataclass(frozen=True)
class Template:
    parts: tuple  # each a literal str or a tuple of alternatives

    @property
    def count(self) -> int:
        total = 1
        for part in self.parts:
            if isinstance(part, tuple):
                total *= len(part)
        return total

    def nth(self, index: int) -> str:
        """The expansion number `index` (0 ≤ index < count)."""
        chosen = []
        for part in reversed(self.parts):
            if isinstance(part, tuple):
                index, pick = divmod(index, len(part))
                chosen.append(part[pick])
            else:
                chosen.append(part)
        return "".join(reversed(chosen)).strip()


def parse(prompt: str, lists: dict[str, list[str]]) -> Template:
    """The prompt's wildcards, or a ServiceError naming the first bad one."""
    parts: list = []
    position = 0
    while position < len(prompt):
        opening = prompt.find("{", position)
        if opening < 0:
            parts += _named(prompt[position:], lists)
            break
        parts += _named(prompt[position:opening], lists)
        closing = prompt.find("}", opening + 1)
        nested = prompt.find("{", opening + 1)
        if closing < 0:
            raise ServiceError(f"the wildcard list opened at character {opening + 1} never closes (a '}}' is missing)")
        if 0 <= nested < closing:
            raise ServiceError(f"wildcard lists do not nest (character {nested + 1})")
        parts.append(tuple(prompt[opening + 1 : closing].split("|")))
        position = closing + 1
    return Template(tuple(parts))


def _named(text: str, lists: dict[str, list[str]]) -> list:
    parts, position = [], 0
    for match in NAMED.finditer(text):
        name = match.group(1)
        if name not in lists:
            raise ServiceError(f"there is no wildcard list named __{name}__ (save one on the Wildcards page)")
        if not lists[name]:
            raise ServiceError(f"the wildcard list __{name}__ is empty")
        parts += [text[position : match.start()], tuple(lists[name])]
        position = match.end()
    parts.append(text[position:])
    return [part for part in parts if part != ""]


def values_checked(values) -> list[str]:
    """A list's values: text, stripped, blanks dropped, at most limits.WILDCARD_VALUES."""
    if isinstance(values, str):
        values = values.splitlines()
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise ServiceError("a wildcard list's values must be a list of texts")
    values = [value.strip() for value in values if value.strip()]
    if not values:
        raise ServiceError("a wildcard list needs at least one value")
    if len(values) > limits.WILDCARD_VALUES:
        raise ServiceError(f"a wildcard list holds at most {limits.WILDCARD_VALUES} values (this one has {len(values)})")
    if any(len(value) > VALUE_CHARS or "\x00" in value for value in values):
        raise ServiceError(f"each value is at most {VALUE_CHARS} characters of text")
    return values


def wildcard_list_save(*, user, name: str, values) -> WildcardList:
    """Create or replace the user's list `name`."""
    name = (name or "").strip().strip("_") if isinstance(name, str) else ""
    if not NAME.match(name) or len(name) > limits.WILDCARD_NAME_CHARS:
        raise ServiceError(
            f"a list name is letters, digits, '-' and '_' (at most {limits.WILDCARD_NAME_CHARS}), "
            "starting and ending with a letter or digit",
            field="name",
        )
    values = values_checked(values)
    with transaction.atomic():
        row, _ = WildcardList.objects.update_or_create(owner=user, name=name, defaults={"values": values})
    return row


def wildcard_list_delete(*, user, name: str) -> int:
    return WildcardList.objects.filter(owner=user, name=name).delete()[0]
