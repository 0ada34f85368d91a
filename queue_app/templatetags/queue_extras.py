"""Small template filters: sizes in MB."""

from django import template

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
