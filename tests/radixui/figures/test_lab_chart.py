"""The Capacity lab's sweep chart keeps coinciding policies visible (LRU and FIFO on the conversation
trace): the later one's markers open, the earlier one's larger, a legend and a note saying so; the
progress line names the point being replayed."""
from __future__ import annotations

import dataclasses

import pytest

from core.lab.sweep import run_sweep
from core.lab.workloads import generated_shared_prefix
from radixui.figures.lab_chart import GROW, coinciding_groups, sweep_figure
from radixui.panels.lab_progress import SweepProgress

CAPS = [72, 144, 288, 576]


@pytest.fixture(scope="module")
def result():
    """A real sweep of lru and lfu (equal at 72, 288 and 576 tokens, not at 144), plus "fifo": lru's points
    with 1 hit token less at 144 (within half a point) and "mru": lru's exactly."""
    wl = generated_shared_prefix(num_groups=6, prompts_per_group=5, system_prompt_len=64, question_len=8,
                                 output_len=4, order="shuffled", seed=2)
    res = run_sweep(wl, CAPS, ["lru", "lfu"], page_size=1, workers=1)
    lru = [p for p in res.points if p.policy == "lru"]
    fifo = [dataclasses.replace(p, policy="fifo", hit_tokens=p.hit_tokens - (p.capacity_tokens == 144)) for p in lru]
    mru = [dataclasses.replace(p, policy="mru") for p in lru]
    return dataclasses.replace(res, policies=["lru", "lfu", "fifo", "mru"], points=res.points + fifo + mru)


def test_the_synthetic_policies_coincide_with_lru_and_lfu_does_not(result):
    rates = {p.policy: [] for p in result.points}
    for p in result.points:
        rates[p.policy].append(p.hit_rate)
    assert 0 < max(abs(a - b) for a, b in zip(rates["lru"], rates["fifo"])) < 0.005
    assert max(abs(a - b) for a, b in zip(rates["lru"], rates["lfu"])) > 0.005
    assert coinciding_groups(result) == [["lru", "fifo", "mru"]]


def test_later_coinciding_markers_are_open_over_a_larger_first_marker(result):
    fig = sweep_figure(result)
    by = {t.name.split(" ")[0]: t for t in fig.data}
    assert list(by["lru"].marker.symbol) == ["circle"] * 4 and list(by["lru"].marker.size) == [11 + GROW] * 4
    assert list(by["fifo"].marker.symbol) == ["diamond-open"] * 4
    assert list(by["fifo"].marker.size) == [9 + GROW] * 4         # mru, drawn after it, covers it too
    assert list(by["mru"].marker.symbol) == ["triangle-up-open"] * 4 and list(by["mru"].marker.size) == [10] * 4
    # lfu equals lru (drawn before it) and fifo, mru (after it) at 72, 288 and 576, not at 144
    assert list(by["lfu"].marker.symbol) == ["square-open"] * 4 and list(by["lfu"].marker.size) == [19, 13, 19, 19]
    # colours stay the policies' own
    assert (by["lru"].line.color, by["fifo"].line.color, by["mru"].line.color) == ("#1f77b4", "#2ca02c", "#9467bd")


def test_legend_and_note_say_which_policies_coincide(result):
    fig = sweep_figure(result)
    names = [t.name for t in fig.data][:4]
    assert names == ["lru (≈ fifo, mru here)", "lfu", "fifo (≈ lru here)", "mru (≈ lru here)"]
    note = fig.layout.annotations[-1].text
    assert note.startswith("lru ≈ fifo ≈ mru here: within 0.5 percentage points at every capacity.")


def test_exactly_equal_policies_read_equals():
    wl = generated_shared_prefix(num_groups=2, prompts_per_group=3, system_prompt_len=16, question_len=4,
                                 output_len=2, order="grouped", seed=1)
    res = run_sweep(wl, [1000], ["lru", "fifo"], page_size=1, workers=1)   # everything fits: same hits
    assert [t.name for t in sweep_figure(res).data][:2] == ["lru (= fifo here)", "fifo (= lru here)"]


def test_policies_equal_at_some_capacities_are_restyled_only_there_and_not_named_equal(result):
    res = dataclasses.replace(result, policies=["lru", "lfu"],
                              points=[p for p in result.points if p.policy in ("lru", "lfu")])
    fig = sweep_figure(res)
    assert [t.name for t in fig.data][:2] == ["lru", "lfu"] and not fig.layout.annotations
    assert list(fig.data[0].marker.symbol) == ["circle"] * 4 and list(fig.data[0].marker.size) == [17, 11, 17, 17]
    assert list(fig.data[1].marker.size) == [13] * 4


def test_progress_names_the_point_being_replayed_and_counts_its_share():
    t = [0.0]
    line = SweepProgress(10, lambda c: f"{c // 1000}k", every_s=0.2, clock=lambda: t[0])
    assert line.start() == (0.0, "0/10 points done · replaying the offline optimum at each capacity first, "
                                  "then every policy")
    assert line.done(1, 10, {"policy": "optimal", "capacity_tokens": 2000, "hit_rate": 0.25}) == \
        (0.1, "1/10 points done · last: optimal at 2k tokens, hit rate 25.0%")
    assert line.point({"policy": "lru", "capacity_tokens": 4000}, 0.5) == \
        (0.15, "1/10 points done · replaying lru at 4k tokens (50%)")
    t[0] = 0.1
    assert line.point({"policy": "lru", "capacity_tokens": 4000}, 0.7) is None     # throttled
    t[0] = 0.35
    assert line.point({"policy": "lru", "capacity_tokens": 4000}, 0.9) == \
        (pytest.approx(0.19), "1/10 points done · replaying lru at 4k tokens (90%)")
    assert line.done(2, 10, {"policy": "lru", "capacity_tokens": 4000, "hit_rate": 0.5})[0] == 0.2


def test_the_note_says_same_for_exact_and_within_for_near_groups(result):
    pts = [p for p in result.points if p.policy in ("lru", "fifo")]
    pts += [dataclasses.replace(p, policy="slru") for p in result.points if p.policy == "lfu"]
    pts += [p for p in result.points if p.policy == "lfu"]
    res = dataclasses.replace(result, policies=["lru", "lfu", "fifo", "slru"], points=pts)
    assert fig_note(res) == ("lru ≈ fifo here: within 0.5 percentage points at every capacity;<br>lfu = slru here: the "
                             "same hit rate at every capacity.<br>The first one's marker is drawn larger, the others "
                             "open on top of it.")


def fig_note(res) -> str:
    return sweep_figure(res).layout.annotations[-1].text


def test_many_policies_get_a_top_margin_for_their_legend_rows_and_each_note_its_own_line(result):
    """16 policies wrapped the legend to 3-4 rows over the title under a fixed 80 px margin; the notes ran on
    one line past the chart's right edge."""
    few = sweep_figure(dataclasses.replace(result, policies=["lru"], points=[p for p in result.points
                                                                             if p.policy == "lru"]))
    many = sweep_figure(result)
    assert many.layout.margin.t > few.layout.margin.t
    policies = [f"p{i}" for i in range(16)]
    lru = [p for p in result.points if p.policy == "lru"]
    sixteen = sweep_figure(dataclasses.replace(result, policies=policies, points=[
        dataclasses.replace(p, policy=q, hit_tokens=p.hit_tokens - i) for i, q in enumerate(policies) for p in lru]))
    assert sixteen.layout.margin.t >= 60 + 24 * 4
