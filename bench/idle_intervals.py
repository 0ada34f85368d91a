"""Interval arithmetic of bench/idle_slots.py: busy and idle slot-seconds from intervals.

Pure functions over (start, end) intervals on one clock (tests/test_bench_idle_slots.py):
a job's pending, ready, held and claimed stretches from its status log, the pieces
between every interval edge, busy and idle slot-seconds per provider with the idle gaps,
the ideal wall time, and a gap's likely cause in words.
"""


def union_length(intervals, start=float("-inf"), end=float("inf")) -> float:
    """Seconds covered by at least one interval, inside [start, end]."""
    total, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def job_states(rows, until: float) -> tuple[list, list, list, list]:
    """From one job's log rows (at, status, not_before, lease owner) in order: its pending
    intervals, the parts of them past the backoff (`not_before`), its processing intervals
    (a slot held in the engine), and the parts of those before a worker took the claim
    (no lease owner yet), each ending at the next row or `until`."""
    pending, ready, held, claimed = [], [], [], []
    for (at, status, not_before, owner), following in zip(rows, [*rows[1:], None], strict=True):
        end = following[0] if following else until
        if end <= at:
            continue
        if status == "pending":
            pending.append((at, end))
            begin = max(at, not_before or at)
            if begin < end:
                ready.append((begin, end))
        elif status == "processing":
            held.append((at, end))
            if not owner:
                claimed.append((at, end))
    return pending, ready, held, claimed


def segments(start: float, end: float, layers: dict) -> list[tuple[float, float, dict]]:
    """Cut [start, end] at every interval edge of every layer; for each piece, how many
    intervals of each layer cover it."""
    edges = {start, end}
    deltas: dict[str, list] = {}
    for name, intervals in layers.items():
        events = []
        for a, b in intervals:
            a, b = max(a, start), min(b, end)
            if b > a:
                edges.update((a, b))
                events += [(a, 1), (b, -1)]
        deltas[name] = sorted(events)
    cuts = sorted(edges)
    counts = {name: 0 for name in layers}
    cursor = {name: 0 for name in layers}
    pieces = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        for name, events in deltas.items():
            i = cursor[name]
            while i < len(events) and events[i][0] <= a:
                counts[name] += events[i][1]
                i += 1
            cursor[name] = i
        pieces.append((a, b, dict(counts)))
    return pieces


def runs(pieces, predicate) -> list[tuple[float, float, list]]:
    """Maximal stretches of consecutive pieces for which predicate(counts) holds."""
    found, current = [], None
    for a, b, counts in pieces:
        if predicate(counts):
            if current and current[1] == a:
                current = (current[0], b, current[2] + [(a, b, counts)])
            else:
                if current:
                    found.append(current)
                current = (a, b, [(a, b, counts)])
        elif current:
            found.append(current)
            current = None
    if current:
        found.append(current)
    return found


def idle_figures(limit: int, start: float, end: float, *, calls, pending, ready, held, retry, claimed=()) -> dict:
    """Per provider, from intervals on one clock: busy and idle slot-seconds and the idle
    gaps. `ready` are pending jobs past their backoff; `retry` the Retry-After windows the
    provider asked for (no work is ready inside them); `held` the slots the engine held,
    `claimed` those of them no worker had taken yet."""
    layers = dict(calls=calls, pending=pending, ready=ready, held=held, retry=retry, claimed=claimed)
    pieces = segments(start, end, layers)
    busy = idle_ready = idle_retry = idle_backoff = 0.0
    for a, b, c in pieces:
        free = max(0, limit - c["calls"])
        span = b - a
        busy += min(limit, c["calls"]) * span
        waiting = min(free, c["pending"])
        if not waiting:
            continue
        if c["retry"]:
            idle_retry += waiting * span
            continue
        usable = min(free, c["ready"])
        idle_ready += usable * span
        idle_backoff += (waiting - usable) * span

    def ready_idle(c):
        return not c["retry"] and min(limit - c["calls"], c["ready"]) > 0

    gaps = []
    for a, b, inside in runs(pieces, ready_idle):
        # What the engine did meanwhile: every slot held (a lease or a claim without a
        # call: a dead owner, a hand-off not yet taken, a slow release) or a slot free in
        # the engine while ready work waited (nothing dispatched it).
        held_full = sum(y - x for x, y, c in inside if c["held"] >= limit)
        # A gap that opens as a Retry-After window closes is dispatch waiting for a
        # cool-down's end it was not woken for.
        closed = [stop for _, stop in retry if stop <= a + 0.05]
        gaps.append(
            dict(
                start=a,
                end=b,
                seconds=b - a,
                slot_seconds=sum((y - x) * min(limit - c["calls"], c["ready"]) for x, y, c in inside),
                all_held_seconds=held_full,
                untaken_claim_seconds=sum(y - x for x, y, c in inside if c["held"] >= limit and c["claimed"]),
                free_in_engine_seconds=(b - a) - held_full,
                ready_max=max(c["ready"] for _, _, c in inside),
                after_retry_after=a - max(closed) if closed and a - max(closed) < 0.5 else None,
            )
        )
    gaps.sort(key=lambda gap: gap["seconds"], reverse=True)
    return dict(
        busy_slot_seconds=busy,
        idle_ready_slot_seconds=idle_ready,
        idle_retry_after_slot_seconds=idle_retry,
        idle_backoff_slot_seconds=idle_backoff,
        gaps=gaps,
    )


def ideal_seconds(limit: int, calls, retry) -> float:
    """The work the provider did ÷ its limit, plus the Retry-After time it asked for."""
    return sum(b - a for a, b in calls) / limit + union_length(retry)


def explain(gap: dict, disruptions: list[tuple[float, str]], within: float = 30.0) -> str:
    """A gap's likely cause in words: for how long the engine held every slot (leases and
    claims without a call: a dead owner, a hand-off not taken, a slow release) and for how
    long a slot was free in the engine while ready work waited (nothing dispatched it), and
    the last disruption before it."""
    parts = []
    if gap["all_held_seconds"] > 0:
        held = f"every slot held in the engine without a call {gap['all_held_seconds']:.2f} s"
        untaken = gap.get("untaken_claim_seconds", 0.0)
        if untaken:
            held += f" ({untaken:.2f} s with a claim no worker had taken)"
        parts.append(held)
    if gap["free_in_engine_seconds"] > 0:
        parts.append(f"a slot free in the engine while ready work waited (no dispatch) {gap['free_in_engine_seconds']:.2f} s")
    state = ", ".join(parts)
    if gap.get("after_retry_after") is not None:
        state += f"; opened {gap['after_retry_after']:.2f} s after a Retry-After window ended"
    before = [(at, what) for at, what in disruptions if at <= gap["end"] and gap["start"] - at <= within]
    if before:
        at, what = before[-1]
        state += f"; {gap['start'] - at:+.1f} s after {what}" if at <= gap["start"] else f"; {what} inside it"
    return state
