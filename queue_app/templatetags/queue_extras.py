"""Small template filters: sizes in MB, field names as labels."""

from django import template

register = template.Library()


@register.filter
def megabytes(value) -> str:
    """Bytes as MB with one decimal below 10 MB ("3.2 MB", "1250 MB")."""
    try:
        mb = int(value or 0) / 1e6
    except (TypeError, ValueError):
        return "—"
    return f"{mb:.1f} MB" if mb < 10 else f"{mb:.0f} MB"


@register.filter
def field_label(name) -> str:
    """ "aspect_ratio" → "Aspect ratio"."""
    return str(name).replace("_", " ").capitalize()
