"""bench/: one figure line per figure, RESULTS.md built from them, benches that can run side
by side, and the size rules (no module over 400 lines, no function over 60)."""

from pathlib import Path

import pytest

from bench import figures, run_all, runner
from tests.test_layout import FUNCTION_LINES, function_lengths, long_modules

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_a_figure_prints_its_goal_and_verdict_and_is_recorded_under_run_all(tmp_path, monkeypatch, capsys):
    recorded = tmp_path / "figures.jsonl"
    monkeypatch.setenv(figures.FIGURES_ENV, str(recorded))
    figures.emit("slot_turnover_p95", "25.0", "ms", "p50 9.1", stack="postgresql+redis", goal="p95 < 20 ms", met=False)
    figures.emit("claims_per_second", 88, "claims/s", stack="sqlite")
    assert capsys.readouterr().out.splitlines() == [
        "bench.slot_turnover_p95[postgresql+redis] 25.0 ms (p50 9.1; goal p95 < 20 ms: misses)",
        "bench.claims_per_second[sqlite] 88 claims/s",
    ]
    assert [(row["name"], row["value"], row["goal"], row["met"]) for row in figures.read(recorded)] == [
        ("slot_turnover_p95", "25.0", "p95 < 20 ms", False),
        ("claims_per_second", "88", "", None),
    ]


def test_a_chaos_figure_keeps_its_line_and_nothing_is_recorded_outside_run_all(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(figures.FIGURES_ENV, raising=False)
    figures.emit("jobs_lost", 0, "jobs", "must be 0", prefix="chaos")
    assert capsys.readouterr().out == "chaos.jobs_lost 0 jobs (must be 0)\n"
    assert list(tmp_path.iterdir()) == []


def test_the_results_page_has_one_row_per_figure_with_its_verdict():
    rows = [
        dict(name="recovery_scan_time", stack="postgresql", value="4.52", unit="s", goal="< 10 s", met=True),
        dict(name="detached_poll_status", stack="postgresql", value="a | b", unit="", goal="", met=None),
        dict(name="wall_over_ideal", stack="postgresql+redis", value="1.200", unit="x", goal="≤ 1.10", met=False),
    ]
    page = run_all.results_page(["- cores: 2"], rows, ["bench.idle_slots [postgresql+redis]: exited 1"], quick=False)
    assert "| recovery_scan_time | postgresql | 4.52 | s | < 10 s | yes |" in page
    assert "| detached_poll_status | postgresql | a \\| b | — | — | — |" in page
    assert "| wall_over_ideal | postgresql+redis | 1.200 | x | ≤ 1.10 | **no** |" in page
    assert "Goals met: 1 of 2." in page
    assert "- bench.idle_slots [postgresql+redis]: exited 1" in page


@pytest.mark.parametrize(
    "has_pg, has_redis, expected",
    [(True, True, "postgresql"), (False, True, "sqlite"), (True, False, "postgresql")],
)
def test_a_stack_choice_takes_the_first_stack_whose_servers_answer(has_pg, has_redis, expected):
    servers = run_all.Servers("postgres://pg/test", "redis://r/4", has_pg, has_redis)
    assert servers.pick("postgresql|sqlite") == expected
    assert servers.pick("postgresql+redis") == ("postgresql+redis" if has_pg and has_redis else None)
    assert servers.urls("sqlite+redis") == {"database_url": "", "redis_url": "redis://r/4"}


def test_a_bench_on_sqlite_gets_no_empty_server_options():
    on_sqlite = {"database_url": "", "redis_url": ""}
    template = run_all.ON_DATABASE + run_all.ON_BROKER + ("--modes", "embedded")
    assert run_all.arguments(template, on_sqlite) == ["--modes", "embedded"]
    on_pg = {"database_url": "postgres://pg/test", "redis_url": ""}
    assert run_all.arguments(template, on_pg) == ["--database-url", "postgres://pg/test", "--modes", "embedded"]


def test_every_registered_bench_exists_and_names_known_stacks():
    known = {"sqlite", "sqlite+orm", "sqlite+redis", "postgresql", "postgresql+redis"}
    for bench in run_all.BENCHES:
        assert (BENCH / f"{bench.module.removeprefix('bench.')}.py").is_file(), bench.module
        assert {stack for choice in bench.stacks for stack in choice.split("|")} <= known, bench


def test_database_and_cluster_names_take_the_prefix_from_the_environment(monkeypatch):
    monkeypatch.delenv(runner.PREFIX_ENV, raising=False)
    assert runner.prefixed("rs_chaos") == "rs_chaos"
    monkeypatch.setenv(runner.PREFIX_ENV, "ann_")
    assert runner.prefixed("rs_chaos") == "ann_rs_chaos"


def test_no_bench_module_is_over_400_lines_or_has_a_function_over_60():
    paths = sorted(BENCH.glob("*.py"))
    assert long_modules(paths) == []
    long = [
        f"{path.name}::{name}: {lines}"
        for path in paths
        for name, lines in function_lengths(path.read_text())
        if lines > FUNCTION_LINES
    ]
    assert long == []
