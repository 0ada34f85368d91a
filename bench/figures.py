"""One figure, one line: what every bench prints, and what bench/RESULTS.md is built from.

`emit("slot_turnover_p95", "12.3", "ms", stack="postgresql+redis", goal="< 20 ms", met=True)`
prints `bench.slot_turnover_p95[postgresql+redis] 12.3 ms (goal < 20 ms: meets)`. When
BENCH_FIGURES names a file (bench/run_all.py sets it for every bench it starts), the same
figure is appended there as one JSON line, which run_all turns into the RESULTS.md table.
`goal` is the goal in words; `met` says whether this run meets it (None: not judged here).
"""

import json
import os

FIGURES_ENV = "BENCH_FIGURES"


def emit(
    name: str,
    value,
    unit: str = "",
    note: str = "",
    *,
    stack: str = "",
    goal: str = "",
    met: bool | None = None,
    prefix: str = "bench",
) -> None:
    """Print the figure's line and, under run_all, record it."""
    print(line(name, value, unit, note, stack=stack, goal=goal, met=met, prefix=prefix), flush=True)
    path = os.getenv(FIGURES_ENV)
    if path:
        record = dict(name=name, stack=stack, value=str(value), unit=unit, goal=goal, met=met, note=note)
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def line(name, value, unit="", note="", *, stack="", goal="", met=None, prefix="bench") -> str:
    """`<prefix>.<name>[<stack>] <value> <unit> (<note>; goal <goal>: meets|misses)`."""
    text = f"{prefix}.{name}" + (f"[{stack}]" if stack else "") + f" {value}"
    if unit:
        text += f" {unit}"
    verdict = "" if met is None else (": meets" if met else ": misses")
    comparison = "; ".join(part for part in (note, f"goal {goal}{verdict}" if goal else "") if part)
    if comparison:
        text += f" ({comparison})"
    return text


def read(path) -> list[dict]:
    """The figures recorded in `path`, in the order they were emitted."""
    try:
        with open(path, encoding="utf-8") as source:
            return [json.loads(row) for row in source if row.strip()]
    except FileNotFoundError:
        return []


def percentile(values, p):
    """The p-th percentile (0-100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]
