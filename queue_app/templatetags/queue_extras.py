"""Small template helpers: sizes (queue_app/sizes.py), a form's one-time token."""

from django import template
from django.utils.html import format_html

from queue_app.sizes import human_bytes
from queue_app.web.form_once import FIELD, new_token

register = template.Library()


@register.filter
def size(value) -> str:
    """Bytes as people read them: "1.5 KB", "20 MB" (queue_app/sizes.py)."""
    return human_bytes(value)


@register.simple_tag
def form_token() -> str:
    """The one-time token of a form that creates or starts something (web/form_once.py)."""
    return format_html('<input type="hidden" name="{}" value="{}">', FIELD, new_token())
