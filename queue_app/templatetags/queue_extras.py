"""Small template helpers: sizes (queue_app/sizes.py), family and kind names, a form's
one-time token."""

from django import template
from django.utils.html import format_html

from queue_app.models.choices import Family, Kind
from queue_app.sizes import human_bytes
from queue_app.web.form_once import FIELD, new_token

register = template.Library()


@register.filter
def money(amount) -> str:
    """A ledger amount in cents, or finer below a cent (selectors/estimate.money)."""
    from queue_app.selectors.estimate import money as shown

    return "" if amount is None else shown(amount)


@register.filter
def size(value) -> str:
    """Bytes as people read them: "1.5 KB", "20 MB" (queue_app/sizes.py)."""
    return human_bytes(value)


@register.filter
def family_name(value) -> str:
    """A provider family as it calls itself: OpenAI, Gemini, RunningHub (models/choices.py)."""
    return Family(value).label if value in Family.values else str(value or "")


@register.filter
def kind_name(value) -> str:
    """A project kind as the pages say it: Image, Video, ComfyUI."""
    return Kind(value).label if value in Kind.values else str(value or "")


@register.simple_tag
def form_token() -> str:
    """The one-time token of a form that creates or starts something (web/form_once.py)."""
    return format_html('<input type="hidden" name="{}" value="{}">', FIELD, new_token())
