"""The capacity lab's chart: a line per policy, the optimum dashed, the infinite-capacity rate dotted."""
from __future__ import annotations

import pytest

from core.lab.sweep import run_sweep
from core.lab.workloads import generated_shared_prefix
from radixui.lab_plot import hit_rate_figure

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


def test_chart_without_optimum_still_shows_the_infinite_bound():
    wl = generated_shared_prefix(num_groups=2, prompts_per_group=2, system_prompt_len=16, question_len=4,
                                 output_len=2, seed=1)
    res = run_sweep(wl, [32, 64], ["lru"], workers=1, with_optimal=False)
    names = [t.name for t in hit_rate_figure(res).data]
    assert names[0] == "lru" and names[1].startswith("infinite") and len(names) == 2
