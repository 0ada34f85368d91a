"""Small template helpers: sizes in MB, a form's one-time token."""

from django import template
from django.utils.html import format_html

from queue_app.web.form_once import FIELD, new_token

register = template.Library()
MIB = 1024 * 1024


@register.filter
def megabytes(value) -> str:
    """Bytes as MB (MiB, as the 25 MB-per-job rule counts them) with one decimal below 10."""
    try:
        mb = int(value or 0) / MIB
    except (TypeError, ValueError):
        return "—"
    return f"{mb:.1f} MB" if mb < 10 else f"{mb:.0f} MB"


@register.simple_tag
def form_token() -> str:
    """The one-time token of a form that creates or starts something (web/form_once.py)."""
    return format_html('<input type="hidden" name="{}" value="{}">', FIELD, new_token())
