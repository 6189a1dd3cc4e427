"""Sweeps (in process and in a process pool), the results table, thresholds, files.
(The chart lives in core/lab/chart.py: tests/lab/test_chart.py.)"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from core.lab.optimal import Bounds
from core.lab.replay import replay
from core.lab.sweep import OPTIMAL, parse_capacities, parse_policies, rounding_note, run_sweep
from core.lab.units import parse_capacity
from core.lab.workloads import TraceRequest, Workload, few_shot, generated_shared_prefix


@pytest.fixture(scope="module")
def workload():
    return generated_shared_prefix(num_groups=6, prompts_per_group=5, system_prompt_len=64, question_len=8,
                                   output_len=4, order="shuffled", seed=2)


CAPS = [76, 144, 288, 576]   # each pool fits the smallest request (75 tokens); smaller: tests/lab/test_nothing_fits.py


@pytest.fixture(scope="module")
def result(workload):
    calls = []
    res = run_sweep(workload, CAPS, ["lru", "lfu", "mru"], page_size=1, workers=1,
                    progress=lambda d, t, row: calls.append((d, t, row["policy"])))
    res.calls = calls
    return res


def test_sweep_matches_single_replays_and_bounds(workload, result):
    assert [(p.policy, p.capacity_tokens) for p in result.points] == [
        (pol, c) for pol in ("lru", "lfu", "mru") for c in CAPS]
    for p in result.points:
        assert p.hit_tokens == replay(workload, p.capacity_tokens, p.policy).hit_tokens
    b = Bounds(workload, 1)
    assert [o.hit_tokens for o in result.optimal] == [b.optimal(c).hit_tokens for c in CAPS]
    assert result.infinite.hit_tokens == b.infinite().hit_tokens


def test_progress_is_reported_per_point(result):
    assert len(result.calls) == 4 * 3 + 4
    assert [d for d, _, _ in result.calls] == list(range(1, 17)) and {t for _, t, _ in result.calls} == {16}


def test_table_has_a_row_per_point_and_the_gap(result):
    df = result.table()
    assert len(df) == 16 and list(df["policy"].unique()) == ["lru", "lfu", "mru", OPTIMAL]
    pol = df[df.policy != OPTIMAL]
    assert (pol["gap_to_optimal"] >= 0).all()
    assert (pol["gap_to_optimal"] == pol["optimal_hit_rate"] - pol["hit_rate"]).all()
    assert df["evictions"].dtype == "Int64" and df[df.policy == OPTIMAL]["evictions"].isna().all()


def test_with_no_prompt_token_repeated_no_capacity_reaches_the_target():
    """Unique prompts: the infinite-capacity rate is 0, so "90 % of it" was met by the smallest pool swept."""
    from core.lab.workloads import TraceRequest, Workload
    w = Workload("unique", [TraceRequest(prompt=list(range(i * 10, i * 10 + 8)), output_len=2) for i in range(5)])
    res = run_sweep(w, [16, 32, 64], ["lru", "fifo"], workers=1)
    assert res.infinite_hit_rate == 0.0 and all(p.hit_rate == 0.0 for p in res.points)
    assert res.capacity_to_reach(0.9) == {"lru": None, "fifo": None, OPTIMAL: None}


def test_capacity_to_reach_is_the_smallest_swept_capacity(result):
    target = 0.9 * result.infinite_hit_rate
    got = result.capacity_to_reach(0.9)
    for name in ("lru", "lfu", "mru", OPTIMAL):
        rows = [(p.capacity_tokens, p.hit_rate) for p in result.points if p.policy == name] if name != OPTIMAL \
            else [(b.capacity_tokens, b.hit_rate) for b in result.optimal]
        ok = [c for c, h in rows if h >= target]
        assert got[name] == (min(ok) if ok else None)
    assert got[OPTIMAL] is not None and (got["mru"] is None or got["mru"] >= got[OPTIMAL])


def test_parallel_sweep_gives_the_same_numbers(workload, result):
    par = run_sweep(workload, CAPS, ["lru", "lfu", "mru"], page_size=1, workers=2)
    cols = ["policy", "capacity_tokens", "hit_tokens", "evictions", "evicted_tokens", "rejected"]
    pd.testing.assert_frame_equal(par.table()[cols], result.table()[cols])


def test_save_writes_csv_and_json(result, tmp_path):
    paths = result.save(tmp_path / "out")
    df = pd.read_csv(paths["csv"])
    assert len(df) == 16 and "gap_to_optimal" in df.columns
    data = json.loads(paths["json"].read_text())
    assert data["infinite"]["hit_rate"] == result.infinite_hit_rate
    assert len(data["points"]) == 12 and len(data["optimal"]) == 4
    assert data["target_fraction_of_infinite"] == 0.9
    assert data["capacity_to_reach_target"] == result.capacity_to_reach(0.9)
    data = json.loads(result.save(tmp_path / "out50", target=0.5)["json"].read_text())
    assert data["target_fraction_of_infinite"] == 0.5
    assert data["capacity_to_reach_target"] == result.capacity_to_reach(0.5) == {"lru": 288, "lfu": 288, "mru": 288, OPTIMAL: 144}


def test_parsers():
    assert parse_capacity("3M") == 3_000_000 and parse_capacity("512k") == 512_000
    assert parse_capacity("6000p", 512) == 3_072_000 and parse_capacity(" 1.5k ") == 1500
    assert parse_capacities("4k, 1k,4k") == [1000, 4000]
    assert parse_capacities("1000,1001,1007,1008", page_size=16) == [992, 1008]   # 62 pages twice: one row
    assert parse_policies("all") == ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru",   # SGLang's
                                     "gdsf", "arc", "s3fifo", "lecar", "lhd", "recall",         # docs/eviction.md
                                     "recall-value", "lrb", "lrb-arc"]
    assert parse_policies("lfu,lru,lfu") == ["lfu", "lru"]


@pytest.mark.parametrize("call, msg", [
    (lambda w: run_sweep(w, [100, 10], ["lru"], page_size=16), "10 tokens is below one page of 16"),
    (lambda w: run_sweep(w, [100], ["lru", "arcx"], page_size=1), "unknown eviction policy 'arcx'; choose one of: lru"),
    (lambda w: run_sweep(w, [], ["lru"]), "at least one capacity"),
    (lambda w: run_sweep(w, [100], []), "at least one policy"),
    (lambda w: run_sweep(w, ["3X"], ["lru"]), "cannot read capacity"),
    (lambda w: run_sweep(w, [100], ["lru"], page_size=0), "page_size"),
])
def test_bad_sweep_input(call, msg):
    with pytest.raises(ValueError, match=msg):
        call(few_shot(num_requests=3, examples_len=10, question_len=2))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_running_point_reports_its_progress(workers):
    from core.lab.workloads import multi_turn_chat
    w = multi_turn_chat(num_sessions=8, turns=4, system_prompt_len=64, user_len=8, output_len=16)
    seen = []
    res = run_sweep(w, [256, 1024], ["lru", "lfu"], workers=workers, with_optimal=False,
                    point_progress=lambda task, f: seen.append((task["policy"], task["capacity_tokens"], f)))
    assert {(p, c) for p, c, _ in seen} == {(p.policy, p.capacity_tokens) for p in res.points}
    for key in {(p, c) for p, c, _ in seen}:
        fractions = [f for p, c, f in seen if (p, c) == key]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) >= 10
        assert 0.0 <= fractions[0] < 0.1


def test_a_pool_has_no_more_processes_than_points(monkeypatch):
    """--workers 100000 with 50 points forked hundreds of processes (the pool starts every worker up front)."""
    from core.lab import sweep
    asked = []
    real = sweep._run_pool
    monkeypatch.setattr(sweep, "_run_pool", lambda tasks, workers, *rest: (asked.append((len(tasks), workers)),
                                                                          real(tasks, workers, *rest))[1])
    res = run_sweep(few_shot(num_requests=6, examples_len=10, question_len=2), [40, 80], ["lru"], workers=1000,
                    with_optimal=False)
    assert asked == [(2, 2)] and len(res.points) == 2


def test_a_note_about_one_page_says_page():
    """The capped-pool note read "exceed the 1 pages" for a one-page workload."""
    wl = Workload("one", [TraceRequest(list(range(1, 9)), 1)])
    res = run_sweep(wl, [64, 128], ["lru"], page_size=16, workers=1)
    assert res.capped_note().startswith("4, 8 pages exceed the 1 page this workload can ever fill; those points "
                                        "were replayed with 1 page")


def test_capacities_a_page_size_rounds_down_are_named_with_what_they_became():
    """With pages of 512, "1000, 2000, 3000" plotted 512, 1.54k and 2.56k without a word."""
    assert rounding_note("1000, 2k, 1536", 512) == ("a pool holds whole pages of 512 tokens, so capacities are rounded "
                                                    "down: 1000 is 512 tokens, 2k is 1,536 tokens")
    assert rounding_note("512, 3p", 512) is None and rounding_note("1000", 1) is None
    assert rounding_note([5, 6, 7, 8, 9, 10], 4).endswith("7 is 4 tokens, 9 is 8 tokens and 1 more")
