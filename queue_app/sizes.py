"""Sizes said to people, one way everywhere: units of 1024 (as every limit and the 25 MB
per job rule are written) named bytes, KB, MB and GB, one decimal below 10 and none where
it is whole — "512 bytes", "1.5 KB", "20 MB", never "0.0 MB" for a small file. The pages'
script has the same rule (static/queue_app/sizes.js)."""

UNITS = ("KB", "MB", "GB", "TB")


def human_bytes(value) -> str:
    try:
        size = max(0, int(value or 0))
    except (TypeError, ValueError):
        return "—"
    if size < 1024:
        return f"{size} byte{'' if size == 1 else 's'}"
    amount = float(size)
    for unit in UNITS:
        amount /= 1024
        if amount < 1024 or unit == UNITS[-1]:
            break
    text = f"{amount:.1f}" if amount < 10 else f"{amount:.0f}"
    return f"{text.removesuffix('.0')} {unit}"
