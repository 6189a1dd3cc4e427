"""`recall` / `recall-value` (core/cache/eviction/recall.py) and partial-leaf eviction (`evict_tail`):
hand-computed lists, class counts and slots on small trees."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from core.cache.radix_cache import RadixKey
from core.observe.invariants import check_cache_invariants
from core.observe.snapshot import snapshot_cache
from tests.cache.eviction.test_classic import Tree


def test_recall_readmits_to_t2_a_page_arc_has_forgotten():
    """Evicted three nodes ago: gone from ARC's one-pool ghosts, still in recall's memory."""
    got = {}
    for policy in ("arc", "recall"):
        tr = Tree(policy, slots=4)
        tr.put(1, [1, 2])                                       # A
        tr.put(2, [3, 4])                                       # B
        assert tr.evicted(lambda: tr.put(3, [5, 6])) == [(1, 2)]
        assert tr.evicted(lambda: tr.put(4, [7, 8])) == [(3, 4)]
        assert tr.evicted(lambda: tr.put(5, [9, 10])) == [(5, 6)]
        assert tr.pol.b1.size == 4                              # one pool: B and C, A forgotten
        tr.evicted(lambda: tr.put(6, [1, 2]))                  # A again
        got[policy] = (tr.node((1, 2)).ev_list, tr.pol.p)
    assert got == {"arc": (1, 0.0), "recall": (2, 0.0)}        # recall: seen before, p untouched


def test_recall_memory_holds_four_pools_of_pages():
    tr = Tree("recall", slots=4)
    for t in range(1, 12):
        tr.put(t, [10 * t, 10 * t + 1])
    pol = tr.pol
    assert pol.recall.limit == 16 and pol.recall.size == 16    # 4 pools of 4 tokens: 18 evicted, 2 dropped
    names = [name[1] for name in pol.recall.d]
    first = [int(np.frombuffer(b, dtype=np.int64)[0]) for b in names]
    assert first == [t * 10 + k for t in range(2, 10) for k in (0, 1)]   # a name per page, prompts 2..9
    tr.cache.reset()
    assert pol.recall.size == 0 and not pol.recall.d


def test_recall_value_frees_only_the_tail_page_and_keeps_the_head_slots():
    tr = Tree("recall-value", slots=16, page_size=4)
    tr.put(1, list(range(1, 9)))                                # A: 2 pages
    tr.put(2, list(range(11, 19)))                              # B: 2 pages
    head_slots = tr.node(tuple(range(1, 9))).value[:4].tolist()
    tail_slots = tr.node(tuple(range(1, 9))).value[4:].tolist()
    seq = tr.cache.events.last_seq
    assert tr.cache.evict(4) == 4                              # one page: A's tail (both rates 1/2, A older)
    check_cache_invariants(tr.cache)
    ev = [e for e in tr.cache.events.since(seq)]
    assert [e.kind for e in ev if e.kind in ("split", "evict")] == ["split", "evict"]
    evict = [e for e in ev if e.kind == "evict"][0]
    assert evict.token_ids == tuple(range(5, 9)) and list(evict.slots) == tail_slots
    head = tr.node((1, 2, 3, 4))
    assert head.value.tolist() == head_slots and head.is_leaf and head in tr.cache.evictable_leaves
    assert tr.alloc.available() == 4 and tr.cache.total_size() == 12 and tr.pol.size == {1: 12, 2: 0}
    m = tr.cache.match_prefix(RadixKey(list(range(1, 9))))
    assert m.indices.tolist() == head_slots                     # the head still serves its prefix
    assert tr.pol.size == {1: 8, 2: 4}                          # and that was a hit: the head is in T2


def test_recall_value_starts_arcs_split_at_half_the_pool():
    assert Tree("recall-value", slots=40).pol.p == 20.0 and Tree("recall", slots=40).pol.p == 0.0


def test_recall_value_learns_a_class_rate_from_a_page_that_comes_back():
    tr = Tree("recall-value", slots=8)
    tr.put(1, [1, 2, 3, 4])                                     # A: a 4-token sequence, not an extension
    tr.put(2, [5, 6, 7, 8])                                     # B
    pol = tr.pol
    tail = (3, 0, False, -1)                # (bit length of 4, last page, no prefix, output never told)
    assert pol._cls(tr.node((1, 2, 3, 4)), 3) == tail and pol._cls(tr.node((1, 2, 3, 4)), 0) == (3, 2, False, -1)
    # T1 pages counted as they come in, per class (distance from the end 3, 2 -> 2 bits; 1; 0), halved
    # once (a pool of 8 tokens in); none back yet
    assert pol.ins == {(3, 2, False): 2.0, (3, 1, False): 1.0, (3, 0, False): 1.0} and pol.ret == {}
    assert pol.key(tr.node((1, 2, 3, 4)))[1] == 1 / 3          # (0 back + 1) / (1 in + 2)
    assert tr.evicted(lambda: tr.put(3, [9])) == [(4,)]        # A's last token only (A, B tie: A older)
    assert pol.ret == {}
    tr.put(4, [1, 2, 3, 4], output_len=3)   # a hit on the head [1, 2, 3] (T1: its 3 pages came back), [4]
    # all back 9-10 tokens after A came in: age bucket int(9 * 8 / 8) = 9 -> 4 bits; [4] from the memory
    at4 = [0.0] * 4 + [1.0] + [0.0] * 5
    assert pol.ret == {(3, 2, False): [2 * x for x in at4], (3, 1, False): at4, (3, 0, False): at4}
    assert tr.node((4,)).ev_list == 2                           # recalled: seen before, not counted as new
    assert pol.ins == {(3, 2, False): 2.0, (3, 1, False): 1.0, (3, 0, False): 1.0, (1, 0, False): 1.0}
    # told, but both its nodes are in T2 now: no T1 page of that output; the returns had none told yet
    assert tr.node((1, 2, 3)).ev_out == tr.node((4,)).ev_out == 2
    assert pol.n_out == pol.r_out == {} and pol.n_all == pol.r_all == 0.0
    assert pol._rate(tail) == 2 / 3                             # young: (1 back + 1) / (1 at risk + 2)
    assert pol._rate(tail, 16) == 1 / 2                         # older than its return: (0 + 1) / (0 + 2)
    total = sum(pol.size.values())
    assert total == tr.cache.total_size()


def test_recall_value_counts_a_page_not_back_when_it_comes_in_not_when_it_is_forgotten():
    """The misses weigh at once: the recall memory (8 tokens) still holds both evicted prompts."""
    tr = Tree("recall-value", slots=2)
    for t in range(1, 4):                                       # 3 2-token prompts, none back
        tr.put(t, [10 * t, 10 * t + 1])
    pol = tr.pol
    assert pol.recall.size == 4 and pol.ret == {}              # prompts 1, 2 evicted and remembered
    # one page of each class per prompt, halved each pool (2 tokens): ((1/2 + 1) / 2 + 1) / 2
    assert pol.ins == {(2, 1, False): 0.875, (2, 0, False): 0.875}
    assert pol._rate((2, 0, False, -1)) == 1 / 2.875


def test_recall_value_counts_a_page_back_from_the_memory_at_its_age_and_by_its_own_name():
    """A came in 8 tokens in and was evicted in parts (tail, then head); asked for again at 16 tokens, both
    its pages are found by name (a page's name is its own tokens, not its neighbours') and count as back
    at age 8: bucket int(8 * 8 / 4) = 16 -> 5 bits, halved once since (the pool of 4 turned over)."""
    tr = Tree("recall-value", slots=4)
    for t in range(1, 5):
        tr.put(t, [50 + 2 * t, 51 + 2 * t])                     # fillers: 8 tokens in
    tr.put(5, [1, 2])                                           # A
    tr.put(6, [3, 4])
    assert tr.evicted(lambda: tr.put(7, [5, 6])) == [(2,), (1,)]
    tr.put(8, [1, 2])
    at5 = [0.0] * 5 + [0.5] + [0.0] * 4
    assert tr.pol.ret == {(2, 1, False): at5, (2, 0, False): at5} and tr.node((1, 2)).ev_list == 2


def test_recall_value_ranks_a_page_past_its_class_return_age_below_a_younger_page():
    """X prompts come back at once; Y came back 12 tokens after it came in. By class rate alone the stale
    X4 (0.67) would outlive the fresh Y2 (0.5); not back by its age, X4's chance is 1/3: it goes first."""
    tr = Tree("recall-value", slots=40)
    tr.put(1, [300, 301, 302, 303])                             # Y1: a 4-token prompt ...
    for k in range(8):                                          # (fillers: 1 token, back at once: T2)
        tr.put(2 + k, [200 + k])
        tr.hit(2.5 + k, [200 + k])
    tr.hit(10, [300, 301, 302, 303])                            # ... back 12 tokens after it came in
    for k in range(3):                                          # X1-X3: 2-token prompts, back at once
        tr.put(11 + k, [10 * k + 1, 10 * k + 2])
        tr.hit(11.5 + k, [10 * k + 1, 10 * k + 2])
    tr.put(14, [91, 92])                                        # X4: never back
    for k in range(8, 16):
        tr.put(15 + k, [200 + k])
        tr.hit(15.5 + k, [200 + k])
    tr.put(40, [310, 311, 312, 313])                            # Y2, fresh: 32 tokens in, no decay yet
    pol = tr.pol
    x4, y2 = tr.node((91, 92)), tr.node((310, 311, 312, 313))
    assert pol._rate(pol._cls(x4, 1)) == 4 / 6 and pol._rate(pol._cls(y2, 3)) == 2 / 4   # at age 0
    # X4 is 14 tokens old (bucket int(14 * 8 / 40) = 2 -> 2), X came back in bucket 0: none back later,
    # 3 of 4 back earlier; Y2 is 4 tokens old (bucket 0), Y's return (bucket 2) is still ahead of it
    assert pol.key(x4)[1] == (0 + 1) / (4 - 3 + 2) and pol.key(y2)[1] == (1 + 1) / (2 + 2)
    tr.pol.p = 0.0                     # T1 goes first (its 6 tokens are under the half-pool target)
    assert tr.evicted(lambda: tr.put(41, list(range(400, 410)))) == [(92,), (91,)]


def test_recall_value_frees_a_tail_by_class_runs_and_never_more_than_asked():
    """Tokens 1..12: classes by distance from the end are runs {12} {11} {9, 10} {5..8} {1..4}."""
    tr = Tree("recall-value", slots=12)
    tr.put(1, list(range(1, 13)))
    assert tr.evicted(lambda: tr.cache.evict(3)) == [(12,), (11,), (10,)]      # the {9, 10} run, capped at 1
    assert tr.evicted(lambda: tr.cache.evict(4)) == [(9,), (6, 7, 8)]          # then {5..8}, capped at 3
    assert [tuple(n.key.token_ids.tolist()) for n in tr.cache.nodes()[1:]] == [(1, 2, 3, 4, 5)]
    assert tr.alloc.available() == 7 and tr.pol.size == {1: 5, 2: 0}


def test_the_dashboards_event_replay_rebuilds_a_tree_evicted_in_parts():
    """Partial evictions are a split then an evict in the event log: radixui's time travel replays them."""
    import dataclasses
    import random

    from core.observe.time_travel import empty_snapshot, replay

    for page_size in (1, 4):
        tr = Tree("recall-value", slots=64, page_size=page_size)
        rng = random.Random(3)
        for t in range(1, 60):
            stem = [rng.randrange(1, 6) for _ in range(rng.randrange(1, 5) * page_size)]
            tr.put(t, stem + [rng.randrange(1, 50) for _ in range(page_size * rng.randrange(1, 4))])
        kinds = [e.kind for e in tr.cache.events]
        assert kinds.count("evict") > 50 and kinds.count("split") > 50
        got = replay(empty_snapshot(64, page_size, "recall-value"), list(tr.cache.events))
        # the replayed eviction order keys by recency (a stand-in: the policy's state is not in the log)
        assert dataclasses.replace(got, eviction_order=()) == dataclasses.replace(snapshot_cache(tr.cache), eviction_order=())


def test_recall_value_classes_a_finished_requests_pages_by_its_output_length():
    """The class's last field is the bit length of the output of the request that inserted the page."""
    tr = Tree("recall-value", slots=16)
    tr.put(1, [1, 2, 3, 4])                                     # cached, its request not finished yet
    a = tr.node((1, 2, 3, 4))
    assert a.ev_out == -1 and tr.pol._cls(a, 3) == (3, 0, False, -1)
    tr.cache.request_finished(a, 5)                              # 5 = 0b101
    assert a.ev_out == 3 and tr.pol._cls(a, 3) == (3, 0, False, 3)
    tr.put(2, [1, 2, 3, 4, 5, 6], output_len=300)               # extends A; 300 needs 9 bits
    assert tr.node((5, 6)).ev_out == 9 and a.ev_out == 3        # A was classed by its own finish
    tr.put(3, [1, 2, 3, 4, 5, 6], output_len=0)                 # all cached: nothing of it is new
    assert tr.node((5, 6)).ev_out == 9
    tr.hit(4, [1, 2, 7])                                        # splits A: both halves keep its class
    assert tr.node((1, 2)).ev_out == 3 and tr.node((3, 4)).ev_out == 3


def test_recall_value_keeps_a_short_answer_prompt_over_a_newer_long_generation():
    """Q1 (1-token answer) comes back; the same-length G prompts (100-token answers) have no evidence yet.
    Told the outputs, Q's value is 2.5 times G's, so the older Q2 outlives G1; untold, every page shares
    one class and recency evicts Q2."""
    got = {}
    for told in (True, False):
        tr = Tree("recall-value", slots=8)
        q, g = (1 if told else None), (100 if told else None)
        tr.put(1, [1, 2], output_len=q)                         # Q1
        tr.hit(2, [1, 2])                                       # Q1 comes back: its class is seen to return
        tr.put(3, [5, 6], output_len=q)                         # Q2
        tr.put(4, [3, 4], output_len=g)                         # G1
        tr.put(5, [7, 8], output_len=g)                         # G2: the pool is full
        if told:
            # at the eviction (8 tokens in, halved once): each last-page class has 2 in, Q1's 0.5 back at
            # age 2 (bucket 2). Q2 (age 6) and G1 (age 4) are past it: (0 + 1) / (2 - 0.5 + 2); G2 (age 2)
            # not: (0.5 + 1) / (2 + 2). The output lift: Q's 1 bit has all of the returns,
            # (1 + 1) (5 + 2) / ((2 + 2) (1 + 1)) = 1.75; G's 7 bits none, (0 + 1) 7 / ((3 + 2) 2) = 0.7
            keys = {k: tr.pol.key(tr.node(k))[1] for k in ((5, 6), (3, 4), (7, 8))}
            assert keys == {(5, 6): 1.75 / 3.5, (3, 4): 0.7 / 3.5, (7, 8): 1.5 / 4 * 0.7}
        got[told] = tr.evicted(lambda: tr.put(6, [9, 10], output_len=g))
    assert got == {True: [(4,), (3,)], False: [(6,), (5,)]}


@pytest.mark.parametrize("bad", [-1, 2.5, None, True, "3", float("nan")])
def test_request_finished_and_insert_refuse_a_bad_output_len_and_change_nothing(bad):
    tr = Tree("recall-value", slots=8)
    tr.put(1, [1, 2])
    a = tr.node((1, 2))
    with pytest.raises(ValueError, match="output_len must be a non-negative integer"):
        tr.cache.request_finished(a, bad)
    if bad is not None:                                         # insert's output_len=None means "not told"
        mine = tr.alloc.alloc(1)
        with pytest.raises(ValueError, match="output_len must be a non-negative integer"):
            tr.cache.insert(RadixKey([1, 2, 3]), torch.cat([a.value, mine]), output_len=bad)
        assert [tuple(n.key.token_ids.tolist()) for n in tr.cache.nodes()[1:]] == [(1, 2)]
        check_cache_invariants(tr.cache, mine)                         # the caller still owns its slot: nothing kept
        tr.alloc.free(mine)
    assert a.ev_out == -1
    check_cache_invariants(tr.cache)


def test_request_finished_refuses_an_evicted_node_and_a_non_node_and_ignores_the_root():
    tr = Tree("recall-value", slots=4)
    tr.put(1, [1, 2])
    a = tr.node((1, 2))
    tr.cache.evict(2)
    with pytest.raises(ValueError, match="no longer in the tree"):
        tr.cache.request_finished(a, 4)
    with pytest.raises(ValueError, match="needs the request's TreeNode"):
        tr.cache.request_finished(None, 4)
    tr.cache.request_finished(tr.cache.root_node, 4)            # a request that cached nothing: no-op
    assert not hasattr(tr.cache.root_node, "ev_out")
    check_cache_invariants(tr.cache)


def test_the_engine_tells_recall_value_each_finished_requests_output_length():
    from core.engine.engine import Engine
    from core.engine.sampling import SamplingParams
    from tests.tiny_models import tiny_pair

    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=128, eviction_policy="recall-value")
    a, b, c1 = list(range(1, 21)), list(range(40, 60)), list(range(80, 90))
    for prompt, n in ((a, 3), (b, 9), (c1, 1)):                 # 3 = 0b11, 9 = 0b1001
        (c,) = e.generate([prompt], SamplingParams(max_new_tokens=n, ignore_eos=True))
        assert len(c.token_ids) == n
    def request_of(n) -> int:                                   # the first token of its path
        while n.parent is not e.cache.root_node:
            n = n.parent
        return int(n.key.token_ids[0])

    nodes = e.cache.nodes()[1:]
    assert len(nodes) == 5      # a prompt node and an output node each; one output token adds no KV: no node
    assert sorted((request_of(n), n.ev_out) for n in nodes) == [(1, 2), (1, 2), (40, 4), (40, 4), (80, 1)]
    e.check_invariants()


def test_recall_value_with_one_output_length_ranks_by_the_other_fields_to_the_last_bit():
    """Every request told the same output length: the output field's lift is exactly 1.0, so the rates
    (and so the ranking) are the three-field ones, bit for bit: the generated workloads rank as before."""
    tr = Tree("recall-value", slots=10)
    for t in range(1, 40):
        tr.put(t, [t % 7 + 1, t % 3 + 20, t % 11 + 40, t + 100], output_len=33)
        tr.hit(t + 0.5, [t % 7 + 1, t % 3 + 20])
    pol = tr.pol
    assert set(pol.n_out) == {6} and pol.n_all == pol.n_out[6] > 0 and pol.r_all == pol.r_out[6] > 0
    assert len(pol.ins) == 3 and all(v % 1 for v in pol.ins.values())   # three classes, decayed counts
    for head in pol.ins:
        back = sum(pol.ret.get(head, [0.0]))
        assert pol._rate(head + (6,)) == (back + 1.0) / (max(pol.ins[head], back) + 2.0)
    # 14 of 20 back: a rate over the pooled rate, divided out, makes 0.5 into 0.49999999999999994; the
    # lift must be exactly 1.0 (a class without evidence keeps Laplace's 1/2)
    pol.n_out, pol.r_out, pol.n_all, pol.r_all = {6: 20.0}, {6: 14.0}, 20.0, 14.0
    assert pol._rate((99, 0, False, 6)) == 0.5
