"""bench/idle_slots.py's interval arithmetic: what counts as a slot idle while work waited."""

import pytest

from bench.idle_intervals import explain, ideal_seconds, idle_figures, job_states, union_length


def test_union_length_counts_overlaps_once_and_clips_to_the_window():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_length([(0, 2), (1, 3), (5, 6)], start=1, end=5.5) == pytest.approx(2.5)
    assert union_length([]) == 0


def test_a_pending_job_is_ready_only_after_its_backoff_and_holds_a_slot_while_processing():
    rows = [
        (0.0, "pending", None, ""),
        (1.0, "processing", None, ""),
        (1.2, "processing", None, "host:7"),
        (2.0, "pending", 3.5, ""),
        (4.0, "processing", None, ""),
        (5.0, "completed", None, ""),
    ]
    pending, ready, held, claimed = job_states(rows, until=9.0)
    assert pending == [(0.0, 1.0), (2.0, 4.0)]
    assert ready == [(0.0, 1.0), (3.5, 4.0)]
    assert held == [(1.0, 1.2), (1.2, 2.0), (4.0, 5.0)]
    assert claimed == [(1.0, 1.2), (4.0, 5.0)]


def test_a_backoff_past_the_pending_stretch_leaves_nothing_ready():
    pending, ready, _, _ = job_states([(0.0, "pending", 9.0, ""), (1.0, "processing", None, "")], until=5.0)
    assert pending == [(0.0, 1.0)] and ready == []


def test_idle_while_ready_excludes_retry_after_windows_and_counts_at_most_the_waiting_jobs():
    # Limit 2. Two calls 0-1; a third job's call 1.2-2 (waiting 0-1.2); two more jobs
    # wait until 3. The provider asked for 2-2.5 (Retry-After).
    calls = [(0, 1), (0, 1), (1.2, 2), (3, 4), (3, 4)]
    pending = [(0, 1.2), (0, 3), (0, 3)]
    figures = idle_figures(2, 0, 4, calls=calls, pending=pending, ready=pending, held=[], retry=[(2, 2.5)])
    assert figures["busy_slot_seconds"] == pytest.approx(2 + 0.8 + 2)
    # 1-1.2: 2 free, 3 ready; 1.2-2: 1 free; 2.5-3: 2 free, 2 ready.
    assert figures["idle_ready_slot_seconds"] == pytest.approx(0.4 + 0.8 + 1.0)
    assert figures["idle_retry_after_slot_seconds"] == pytest.approx(1.0)
    assert [(g["start"], g["end"]) for g in figures["gaps"]] == [(1, 2), (2.5, 3)]


def test_idle_while_every_waiting_job_is_in_backoff_is_reported_apart():
    # One slot, one job waiting 0-2 but in backoff until 1.5.
    figures = idle_figures(1, 0, 2, calls=[], pending=[(0, 2)], ready=[(1.5, 2)], held=[], retry=[])
    assert figures["idle_backoff_slot_seconds"] == pytest.approx(1.5)
    assert figures["idle_ready_slot_seconds"] == pytest.approx(0.5)


def test_no_waiting_work_means_no_idle_however_few_calls_run():
    figures = idle_figures(4, 0, 10, calls=[(0, 1)], pending=[], ready=[], held=[], retry=[])
    assert figures["idle_ready_slot_seconds"] == 0 and figures["gaps"] == []


def test_a_gap_with_every_slot_held_in_the_engine_is_told_from_one_with_a_free_slot():
    held = idle_figures(1, 0, 3, calls=[], pending=[(0, 3)], ready=[(0, 3)], held=[(0, 3)], retry=[])["gaps"][0]
    untaken = idle_figures(1, 0, 3, calls=[], pending=[(0, 3)], ready=[(0, 3)], held=[(0, 3)], retry=[], claimed=[(0, 1)])[
        "gaps"
    ][0]
    free = idle_figures(1, 0, 3, calls=[], pending=[(0, 3)], ready=[(0, 3)], held=[], retry=[])["gaps"][0]
    assert "every slot held in the engine without a call 3.00 s" in explain(held, [(-1.0, "SIGKILL cluster-a")])
    assert "+1.0 s after SIGKILL cluster-a" in explain(held, [(-1.0, "SIGKILL cluster-a")])
    assert "no dispatch) 3.00 s" in explain(free, []) and "every slot held" not in explain(free, [])
    assert "(1.00 s with a claim no worker had taken)" in explain(untaken, [])


def test_ideal_is_the_work_over_the_limit_plus_the_retry_after_time_asked_for():
    assert ideal_seconds(2, [(0, 1), (0, 1), (1, 3)], [(5, 7), (6, 8)]) == pytest.approx(4 / 2 + 3)


def test_a_gap_opening_as_a_retry_after_window_closes_says_so():
    # The window 0-2 asked for; the slot stays idle until 3 with the job ready from 0.
    figures = idle_figures(1, 0, 4, calls=[(3, 4)], pending=[(0, 3)], ready=[(0, 3)], held=[], retry=[(0, 2)])
    (gap,) = figures["gaps"]
    assert (gap["start"], gap["end"]) == (2, 3) and gap["after_retry_after"] == 0
    assert "after a Retry-After window ended" in explain(gap, [])
