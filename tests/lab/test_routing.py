"""The lab's model of sglang-router: exact routes and hit totals on hand-built workloads."""
from __future__ import annotations

import numpy as np
import pytest

from core.lab.page_trace import Overlap
from core.lab.replay import replay
from core.lab.routing import ApproxTree, RouterConfig, prefix_keys, replay_routed, route, route_texts, split
from core.lab.workloads import TraceRequest, Workload

SYS_A = list(range(1000, 1100))     # two 100-token system prompts
SYS_B = list(range(2000, 2100))


def q(i: int) -> list[int]:
    return list(range(10_000 + 10 * i, 10_000 + 10 * i + 10))   # a unique 10-token question


def groups_workload(order: str) -> Workload:
    """A1 A2 B1 B2 A3 B3 (order 'AABBAB'): each prompt = its group's system prompt + a question."""
    reqs, count = [], {"A": 0, "B": 0}
    for g in order:
        count[g] += 1
        reqs.append(TraceRequest((SYS_A if g == "A" else SYS_B) + q(len(reqs)), output_len=1))
    return Workload("groups", reqs)


def test_approx_tree_matches_like_the_routers_own_tests():
    t = ApproxTree(2)
    t.insert(prefix_keys([ord(c) for c in "hello"]), 0)
    t.insert(prefix_keys([ord(c) for c in "world"]), 0)
    t.insert(prefix_keys([ord(c) for c in "hi"]), 1)
    assert t.size == [10, 2] and t.smallest_worker() == 1
    assert t.prefix_match(prefix_keys([ord(c) for c in "hello world!"])) == (5, 0)
    assert t.prefix_match(prefix_keys([ord(c) for c in "hip"])) == (2, 1)
    assert t.prefix_match(prefix_keys([ord(c) for c in "xyz"])) == (0, None)
    t.insert(prefix_keys([ord(c) for c in "help"]), 1)      # worker 1 had 'h': gains 'he', 'hel', 'help'
    assert t.size == [10, 5]
    assert t.prefix_match(prefix_keys([ord(c) for c in "help me"])) == (4, 1)


def test_prefix_keys_name_prefixes():
    a, b = prefix_keys([5, 6, 7]), prefix_keys([5, 6, 8])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert len(set(prefix_keys(list(range(500))))) == 500
    assert prefix_keys([]) == []


def test_round_robin_alternates_and_cache_aware_keeps_groups_together():
    w = groups_workload("AABBAB")
    assert route(w, 2, "round_robin") == [0, 1, 0, 1, 0, 1]
    # sglang-router 0.3: a miss goes to the least loaded worker, the first of equals; one request at
    # a time leaves every load 0, so every miss goes to worker 0 and every hit follows it
    assert route(w, 2, "cache_aware") == [0, 0, 0, 0, 0, 0]
    # older releases: A1 -> smallest tree (0, tie by index); A2 matches 100/110 > 0.3 -> 0;
    # B1 matches 0 -> smallest tree (1); B2 -> 1; A3 -> 0; B3 -> 1
    assert route(w, 2, "cache_aware", RouterConfig(miss_policy="smallest_tree")) == [0, 0, 1, 1, 0, 1]
    assert route(w, 3, "least_load") == [0, 1, 2, 0, 1, 2]


def test_hit_totals_of_each_routing_by_hand():
    """Infinite capacity, page 1, one output token (nothing but the prompt is cached):
    round robin puts A1,B1,A3 on replica 0 and A2,B2,B3 on 1: A3 and B3 hit 100 each.
    cache_aware (smallest-tree misses) keeps each group on one replica: A2, A3, B2, B3 hit 100 each."""
    w = groups_workload("AABBAB")
    rr = replay_routed(w, 10_000, 2, "round_robin")
    ca = replay_routed(w, 10_000, 2, "cache_aware", config=RouterConfig(miss_policy="smallest_tree"))
    assert [r.hit_tokens for r in rr.per_replica] == [100, 100] and rr.hit_tokens == 200
    assert [r.hit_tokens for r in ca.per_replica] == [200, 200] and ca.hit_tokens == 400
    assert ca.requests_per_replica() == [3, 3] and ca.prompt_tokens == 6 * 110
    assert ca.hit_rate == pytest.approx(400 / 660)


def test_one_replica_is_the_single_cache_replay():
    w = groups_workload("ABABBAAB")
    for cap in (150, 250, 10_000):
        one = replay_routed(w, cap, 1, "cache_aware", "lru")
        assert one.hit_tokens == replay(w, cap, "lru").hit_tokens


def test_below_the_cache_threshold_a_prompt_goes_to_the_smallest_tree():
    """A prompt sharing 20 of its 110 tokens (18 %) with replica 0 is sent to the empty replica 1
    at the default threshold 0.3 (smallest-tree misses), and follows the match at threshold 0.1."""
    shared = list(range(20))
    w = Workload("t", [TraceRequest(shared + list(range(100, 190)), 1), TraceRequest(shared + list(range(200, 290)), 1)])
    assert route(w, 2, "cache_aware", RouterConfig(miss_policy="smallest_tree")) == [0, 1]
    assert route(w, 2, "cache_aware", RouterConfig(cache_threshold=0.1, miss_policy="smallest_tree")) == [0, 0]


def test_a_miss_goes_to_the_least_loaded_worker():
    """With overlap, request 1 arrives while request 0 (another group) still runs on worker 0:
    its miss goes to worker 1; request 2 (group of 0) follows the match despite the load."""
    reqs = [TraceRequest(SYS_A + q(0), 100, 0.0), TraceRequest(SYS_B + q(1), 100, 1.0), TraceRequest(SYS_A + q(2), 100, 2.0)]
    assert route(Workload("t", reqs), 2, "cache_aware", overlap=Overlap()) == [0, 1, 0]


def test_imbalance_sends_to_the_least_loaded():
    """Four long requests of one group in flight: with balance thresholds 1 / 1.5 the loads
    (2, 0) are imbalanced after two, so the third goes to replica 1 despite its prefix; the
    fourth (loads 2, 1: balanced) follows the prefix, held by both, to the most recent holder."""
    reqs = [TraceRequest(SYS_A + q(i), output_len=100, timestamp=float(i)) for i in range(4)]
    w = Workload("burst", reqs)
    ov = Overlap(ms_per_output_token=20.0)
    assert route(w, 2, "cache_aware", overlap=ov) == [0, 0, 0, 0]          # default abs threshold 64
    cfg = RouterConfig(balance_abs_threshold=1, balance_rel_threshold=1.5)
    assert route(w, 2, "cache_aware", cfg, overlap=ov) == [0, 0, 1, 1]
    # without overlap nothing is in flight: least_load ties break by fewest routed
    assert route(w, 2, "least_load") == [0, 1, 0, 1]


def test_closed_loop_concurrency_spreads_misses():
    """Concurrency 2: each request arrives while the one before it runs. A1 -> 0; B1 (miss, loads
    1/0) -> 1; A2 follows A1 -> 0; B2 follows B1 -> 1. One at a time, every miss goes to 0."""
    w = groups_workload("ABAB")
    assert route(w, 2, "cache_aware", concurrency=2) == [0, 1, 0, 1]
    assert route(w, 2, "cache_aware", concurrency=1) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="not both"):
        route(w, 2, "cache_aware", overlap=Overlap(), concurrency=2)


def test_prefix_hash_is_stable_and_by_prefix():
    w = groups_workload("ABABAB")
    a = route(w, 4, "prefix_hash", RouterConfig(prefix_tokens=100))
    assert a[0] == a[2] == a[4] and a[1] == a[3] == a[5]
    assert a == route(w, 4, "prefix_hash", RouterConfig(prefix_tokens=100))


def test_route_texts_matches_characters():
    w = Workload("t", [TraceRequest([1], 1), TraceRequest([2], 1), TraceRequest([3], 1)])
    texts = ["You are a helpful assistant. Q: one", "Something else entirely", "You are a helpful assistant. Q: two"]
    assert route_texts(w, texts, 2, config=RouterConfig(miss_policy="smallest_tree")) == [0, 1, 0]
    # 'Q: two' shares 32 of 35 characters (0.91) with the first: below 0.95 it goes to the smaller tree
    assert route_texts(w, texts, 2, config=RouterConfig(cache_threshold=0.95, miss_policy="smallest_tree")) \
        == [0, 1, 1]


def test_split_keeps_arrival_order_and_outputs():
    w = groups_workload("AABBAB")
    shares = split(w, [1, 0, 1, 0, 1, 0], 2)
    assert [len(s) for s in shares] == [3, 3]
    np.testing.assert_array_equal(shares[1].requests[1].prompt_ids(), w.requests[2].prompt_ids())


@pytest.mark.parametrize("bad", [dict(cache_threshold=1.5), dict(balance_abs_threshold=-1),
                                 dict(balance_rel_threshold=0.5), dict(prefix_tokens=0), dict(miss_policy="x")])
def test_bad_router_config_says_what_to_change(bad):
    with pytest.raises(ValueError, match=list(bad)[0]):
        RouterConfig(**bad)


def test_bad_routing_inputs():
    w = groups_workload("AB")
    with pytest.raises(ValueError, match="unknown routing policy"):
        route(w, 2, "sticky")
    with pytest.raises(ValueError, match="replicas must be"):
        route(w, 0, "round_robin")
    with pytest.raises(ValueError, match="timestamp"):
        route(w, 2, "least_load", overlap=Overlap())
