"""The Capacity lab's replicas section: rows and chart from the routing model, against hand counts."""
from __future__ import annotations

from core.lab.routing import RouterConfig
from radixui.panels.lab_routing import routing_figure, routing_rows
from tests.lab.test_routing import groups_workload


def test_rows_route_every_count_and_keep_the_one_cache_reference():
    w = groups_workload("AABBAB")
    df = routing_rows(w, 10_000, [1, 2], ["round_robin", "cache_aware"], "lru", 1, None, None,
                      RouterConfig(miss_policy="smallest_tree"))
    got = {(r.replicas, r.routing): r.hit_rate for r in df.itertuples()}
    # by hand (see tests/lab/test_routing.py): 2 replicas, round robin 200 hit tokens, cache_aware 400, of 660
    assert got[2, "round_robin"] == 200 / 660 and got[2, "cache_aware"] == 400 / 660
    # one cache at 1x and 2x the capacity: every repeat of a system prompt hits, 4 x 100
    assert got[1, "one cache"] == got[2, "one cache"] == got[1, "round_robin"] == 400 / 660
    assert got[2, "optimum"] == 400 / 660
    assert list(df[df.routing == "cache_aware"]["requests per replica"]) == ["6", "3 3"]


def test_figure_draws_a_line_per_routing_and_both_references():
    w = groups_workload("ABAB")
    df = routing_rows(w, 10_000, [1, 2, 3], ["round_robin", "cache_aware", "least_load"], "lru", 1, None, 2)
    fig = routing_figure(df, "10k tokens")
    names = [t.name for t in fig.data]
    assert names[:2] == ["one cache, same eviction with N x the memory", "offline optimum with N x the memory"]
    assert names[2:] == ["round_robin", "cache_aware", "least_load"]
    assert all(list(t.x) == [1, 2, 3] for t in fig.data)
    assert len({t.line.dash for t in fig.data[2:]}) == 3      # no routing hides under another


def test_round_robin_and_cache_aware_get_far_apart_colours_and_their_own_markers():
    w = groups_workload("ABAB")
    df = routing_rows(w, 10_000, [1, 2], ["round_robin", "cache_aware"], "lru", 1, None, None)
    fig = routing_figure(df, "10k tokens")
    style = {t.name: (t.line.color, t.marker.color, t.marker.symbol) for t in fig.data[2:]}
    assert style == {"round_robin": ("#d97706", "#d97706", "circle"), "cache_aware": ("#2563eb", "#2563eb", "diamond")}


def test_progress_names_each_point_before_it_is_computed():
    w = groups_workload("ABAB")
    calls = []
    df = routing_rows(w, 10_000, [1, 2], ["round_robin", "cache_aware"], "lru", 1, None, None,
                      progress=lambda done, total, what: calls.append((done, total, what)))
    assert calls == [(0, 8, "1 replica: one cache of 1 x the memory"), (1, 8, "1 replica: the offline optimum"),
                     (2, 8, "1 replica: round_robin"), (3, 8, "1 replica: cache_aware"),
                     (4, 8, "2 replicas: one cache of 2 x the memory"), (5, 8, "2 replicas: the offline optimum"),
                     (6, 8, "2 replicas: round_robin"), (7, 8, "2 replicas: cache_aware")]
    assert len(df) == 8
