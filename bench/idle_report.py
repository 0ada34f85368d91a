"""The figures of bench/idle_slots.py, from a run's data (and a run against REF beside it).

`figures(now, before)` gives one figure per provider and measure and two for the whole
run, each with the REF run's value in its note when there is one; `emit_all` prints them
through bench/figures.py. `details` is the commented account above them: disruptions,
create outcomes, and every idle gap over GAP_REPORTED with its likely cause.
"""

from bench.figures import emit

STACK = "postgresql+redis"
GAP_REPORTED = 1.0
WALL_GOAL = 1.10


def pick(data, path):
    for part in path:
        if data is None:
            return None
        data = data.get(part)
    return data


def derive(data: dict) -> None:
    """The figures computed from the measured ones: gaps over GAP_REPORTED, the longest
    gap, and wall time over ideal, per provider and for the run."""
    for p in data["providers"].values():
        p["gaps_over_1s"] = sum(1 for g in p["gaps"] if g["seconds"] > GAP_REPORTED)
        p["longest_gap"] = max((g["seconds"] for g in p["gaps"]), default=0.0)
        p["ratio"] = p["wall"] / p["ideal"] if p["ideal"] else 0.0
    data["ratio"] = data["wall"] / data["ideal"]


def provider_rows(name: str, p: dict) -> list[tuple]:
    """(name, path, unit, format, note, goal, passes) of one provider's figures."""
    at = ("providers", name)
    return [
        (f"busy.{name}", (*at, "busy_slot_seconds"), "slot-s", "{:.1f}", f"{name}(limit {p['limit']}, {p['seconds']} s jobs)"),
        (f"idle_while_ready.{name}", (*at, "idle_ready_slot_seconds"), "slot-s", "{:.1f}", "goal: turnover only"),
        (f"idle_in_retry_after.{name}", (*at, "idle_retry_after_slot_seconds"), "slot-s", "{:.1f}", "asked for"),
        (f"idle_all_in_backoff.{name}", (*at, "idle_backoff_slot_seconds"), "slot-s", "{:.1f}", "reported"),
        (f"unexplained_gaps_over_1s.{name}", (*at, "gaps_over_1s"), "gaps", "{:d}", "", "0", lambda value: value == 0),
        (f"longest_unexplained_gap.{name}", (*at, "longest_gap"), "s", "{:.2f}", ""),
        (f"wall.{name}", (*at, "wall"), "s", "{:.1f}", f"ideal {p['ideal']:.1f} s"),
        (f"wall_over_ideal.{name}", (*at, "ratio"), "x", "{:.3f}", ""),
    ]


def figures(now: dict, before: dict | None) -> list[dict]:
    """Every figure of the run, the run against REF beside it."""
    for which in (now, before):
        if which is not None:
            derive(which)
    rows = [row for name, p in now["providers"].items() for row in provider_rows(name, p)]
    rows.append(("wall", ("wall",), "s", "{:.1f}", f"ideal {now['ideal']:.1f} s (bottleneck provider)"))
    rows.append(("wall_over_ideal", ("ratio",), "x", "{:.3f}", "", f"≤ {WALL_GOAL:.2f}", lambda value: value <= WALL_GOAL))
    out = []
    for name, path, unit, fmt, note, *goal in rows:
        value = pick(now, path)
        notes = []
        if before is not None:
            old = pick(before, path)
            notes.append("before " + ("n/a" if old is None else fmt.format(old)))
        if note:
            notes.append(note)
        target, passes = goal or ("", None)
        out.append(
            dict(
                name=f"idle_slots.{name}",
                value=fmt.format(value),
                unit=unit,
                note="; ".join(notes),
                goal=target,
                met=passes(value) if passes else None,
            )
        )
    return out


def emit_all(now: dict, before: dict | None) -> None:
    for figure in figures(now, before):
        emit(stack=STACK, **figure)


def details(data: dict, title: str) -> list[str]:
    out = [f"# {title}: seed {data['seed']}, {data['jobs']} jobs, started {data.get('started', '?')} (+0 s in the logs)"]
    for at, what in data["disruptions"]:
        out.append(f"#   +{at:.1f} s {what}")
    for name, p in data["providers"].items():
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(p["outcomes"].items()))
        out.append(
            f"#   {name}: {p['jobs']} jobs, creates {outcomes}; Retry-After asked {p['retry_after_seconds']:.1f} s; "
            f"nominal {p['nominal']:.1f} s"
        )
        for gap in [g for g in p["gaps"] if g["seconds"] > GAP_REPORTED][:8]:
            out.append(
                f"#     gap +{gap['start']:.2f}→+{gap['end']:.2f} s ({gap['seconds']:.2f} s, {gap['slot_seconds']:.2f} slot-s, "
                f"{gap['ready_max']} ready): {gap['why']}"
            )
    return out
