"""Server-rendered SVG charts: no JavaScript, no chart library, no build step.

A chart is a string of SVG built here from numbers the selectors computed; every bar
carries a <title> so hovering it shows its numbers (browsers render <title> as a
tooltip). The page's auto-refresh redraws it with the rest of the live part. Text goes
through `escape`: provider names are user input.
"""

from functools import lru_cache

from django.utils.html import escape
from django.utils.safestring import mark_safe

BAR_GAP = 1
COLORS = {"completed": "#16a34a", "failed": "#dc2626", "lost": "#d97706"}


@lru_cache(maxsize=32)
def _frame(bins: tuple, width: int) -> tuple[list[tuple[str, float]], str]:
    """Each bin's label and x, and the bar width: the same for every chart of a page (a
    page draws up to 13 over the same bins), so worked out once."""
    slot = width / max(1, len(bins))
    bar = max(1.0, slot - BAR_GAP)
    return [(f"{start:%H:%M}", round(i * slot, 2)) for i, start in enumerate(bins)], f"{bar:.2f}"


def throughput_svg(
    *, bins, completed, failed, step_seconds: int, label: str, lost=None, rate_limited=None, width: int = 480, height: int = 70
):
    """Stacked bars per bin (completed below, lost in amber, failed in red on top), with a
    <title> per bin."""
    lost = lost or [0] * len(completed)
    peak = max([c + f + s for c, f, s in zip(completed, failed, lost, strict=True)] + [1])
    frame, bar = _frame(tuple(bins), width)
    per = "min" if step_seconds == 60 else f"{step_seconds // 60} min"
    parts = [
        f'<svg class="chart" role="img" aria-label="{escape(label)}" width="{width}" height="{height + 14}" '
        f'viewBox="0 0 {width} {height + 14}" xmlns="http://www.w3.org/2000/svg" data-peak="{peak}">',
        f"<title>{escape(label)}: peak {peak} per {per}</title>",
        f'<line x1="0" y1="{height}" x2="{width}" y2="{height}" stroke="#d1d5db"/>',
    ]
    for i, (hhmm, x) in enumerate(frame):
        c, f, s = completed[i], failed[i], lost[i]
        parts.append(f'<g data-bin="{hhmm}" data-completed="{c}" data-failed="{f}" data-lost="{s}">')
        limited = rate_limited[i] if rate_limited else 0
        note = f" ({limited} rate-limited)" if limited else ""
        stopped = f", {s} lost" if s else ""
        parts.append(f"<title>{hhmm} UTC, {per}: {c} completed, {f} failed{note}{stopped}</title>")
        # an invisible full-height bar, so an empty bin still answers a hover
        parts.append(f'<rect x="{x}" y="0" width="{bar}" height="{height}" fill="transparent"/>')
        top = height
        for value, color in ((c, "completed"), (s, "lost"), (f, "failed")):
            if value:
                h = round(height * value / peak, 2)
                top = round(top - h, 2)
                parts.append(f'<rect x="{x}" y="{top}" width="{bar}" height="{h}" fill="{COLORS[color]}"/>')
        parts.append("</g>")
    if bins:
        parts.append(f'<text x="0" y="{height + 12}" font-size="10" fill="#6b7280">{bins[0]:%H:%M}</text>')
        parts.append(
            f'<text x="{width}" y="{height + 12}" font-size="10" fill="#6b7280" text-anchor="end">{bins[-1]:%H:%M} UTC</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - built here, every text escaped


def seconds(value) -> str:
    """0.42s, 12.3s, 4m 05s — a percentile as the table shows it."""
    if value is None:
        return "—"
    if value < 10:
        return f"{value:.2f}s"
    if value < 60:
        return f"{value:.1f}s"
    minutes, rest = divmod(int(value), 60)
    return f"{minutes}m {rest:02d}s"
