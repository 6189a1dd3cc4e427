"""The capacity lab's chart: a line per policy, the optimum dashed, the infinite-capacity rate dotted; every
policy drawn distinctly (two policies with equal hit rates both stay visible); page size and GiB spelled out."""
from __future__ import annotations

import pytest

from core.cache.eviction.registry import POLICIES
from core.lab.chart import hit_rate_figure, policy_style, short_labels
from core.lab.sweep import run_sweep
from core.lab.units import load_model_config
from core.lab.workloads import generated_shared_prefix

CAPS = [72, 144, 288, 576]


@pytest.fixture(scope="module")
def result():
    wl = generated_shared_prefix(num_groups=6, prompts_per_group=5, system_prompt_len=64, question_len=8,
                                 output_len=4, order="shuffled", seed=2)
    return run_sweep(wl, CAPS, ["lru", "lfu", "mru"], page_size=1, workers=1)


def test_chart_has_a_line_per_policy_and_dashed_bounds(result):
    fig = hit_rate_figure(result)
    names = [t.name for t in fig.data]
    assert names[:3] == ["lru", "lfu", "mru"] and names[3] == "optimal (Belady)" and names[4].startswith("infinite")
    assert fig.data[3].line.dash == "dash" and fig.data[4].line.dash == "dot"
    assert list(fig.data[0].x) == CAPS and fig.data[4].y[0] == result.infinite_hit_rate
    assert list(fig.data[0].y) == [p.hit_rate for p in result.points if p.policy == "lru"]


def test_every_policy_has_its_own_marker_and_dash_so_equal_lines_stay_visible():
    styles = {p: policy_style(p) for p in POLICIES}
    assert len({s["marker"]["symbol"] for s in styles.values()}) == len(POLICIES)
    assert len({s["line"]["dash"] for s in styles.values()}) == len(POLICIES)
    # lfu and slru often hit exactly alike: slru, drawn later, must not cover lfu's markers
    lfu, slru = styles["lfu"]["marker"], styles["slru"]["marker"]
    assert lfu["symbol"].endswith("-open") and lfu["size"] > slru["size"]


def test_lfu_and_slru_with_equal_hit_rates_are_both_drawn():
    wl = generated_shared_prefix(num_groups=2, prompts_per_group=4, system_prompt_len=32, question_len=4,
                                 output_len=2, order="grouped", seed=1)
    res = run_sweep(wl, [200, 400], ["lfu", "slru"], workers=1, with_optimal=False)
    fig = hit_rate_figure(res)
    lfu, slru = fig.data[0], fig.data[1]
    assert list(lfu.y) == list(slru.y)                     # the case the issue saw
    assert (lfu.marker.symbol, lfu.line.dash) != (slru.marker.symbol, slru.line.dash)
    assert lfu.visible is not False and slru.visible is not False


def test_page_size_is_spelled_in_title_and_legend_never_as_a_page_number(result):
    fig = hit_rate_figure(result)
    assert "page size 1 token" in fig.layout.title.text and "(page 1)" not in fig.layout.title.text
    assert fig.layout.legend.title.text == "policy (page size 1):"


def test_with_a_model_the_ticks_and_hover_read_gib(result):
    kv = load_model_config("llama-3.1-8b")
    fig = hit_rate_figure(result, kv=kv)
    assert list(fig.layout.xaxis.ticktext) == [f"{c}<br>{c * 131072 / 2 ** 30:.3g} GiB" for c in CAPS]
    assert "GiB of Llama-3.1-8B KV" in fig.layout.xaxis.title.text
    assert fig.data[0].customdata[1][2] == pytest.approx(144 / 8192)
    assert "GiB" in fig.data[0].hovertemplate


def test_chart_without_optimum_still_shows_the_infinite_bound():
    wl = generated_shared_prefix(num_groups=2, prompts_per_group=2, system_prompt_len=16, question_len=4,
                                 output_len=2, seed=1)
    res = run_sweep(wl, [32, 64], ["lru"], workers=1, with_optimal=False)
    names = [t.name for t in hit_rate_figure(res).data]
    assert names[0] == "lru" and names[1].startswith("infinite") and len(names) == 2


def test_capacities_a_few_tokens_apart_get_ticks_that_read_apart():
    """3,000,000 and 3,000,003 (what the page suggests for one 3M-token request) both read '3M'."""
    assert short_labels([512, 3072, 3_072_000]) == ["512", "3.07k", "3.07M"]
    assert short_labels([3_000_000, 3_000_003]) == ["3M", "3.000003M"]
    assert short_labels([1_000_000_000_000, 1_000_000_000_001]) == ["1,000,000,000,000", "1,000,000,000,001"]
