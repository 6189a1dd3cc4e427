"""`recall` / `recall-value` (core/eviction_recall.py) and partial-leaf eviction (`evict_tail`):
hand-computed lists, class counts and slots on small trees."""
from __future__ import annotations

import numpy as np
import torch

from core.radix_cache import RadixKey
from tests.test_eviction_policies import Tree


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
    tr.cache.check_invariants()
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


def test_recall_value_learns_a_class_rate_from_a_page_that_comes_back():
    tr = Tree("recall-value", slots=8)
    tr.put(1, [1, 2, 3, 4])                                     # A: a 4-token sequence, not an extension
    tr.put(2, [5, 6, 7, 8])                                     # B
    pol = tr.pol
    tail = (3, 0, False)                                        # (bit length of 4, last page, no prefix)
    assert pol._cls(tr.node((1, 2, 3, 4)), 3) == tail and pol._cls(tr.node((1, 2, 3, 4)), 0) == (3, 2, False)
    assert pol.key(tr.node((1, 2, 3, 4)))[1] == 0.5            # no evidence: (0 + 1) / (0 + 2)
    assert tr.evicted(lambda: tr.put(3, [9])) == [(4,)]        # A's last token only
    assert pol.n == {} and pol.r == {}                          # its fate is not known yet
    tr.put(4, [1, 2, 3, 4])             # a hit on the head [1, 2, 3] (T1: its 3 pages came back) and [4]
    back = {tail: 1.0, (3, 2, False): 2.0, (3, 1, False): 1.0}   # asked for again from the recall memory
    assert pol.n == back and pol.r == back
    assert tr.node((4,)).ev_list == 2
    assert pol._rate(tail) == 2 / 3
    total = sum(pol.size.values())
    assert total == tr.cache.total_size()


def test_recall_value_counts_a_forgotten_page_as_not_back():
    tr = Tree("recall-value", slots=2)
    tr.put(1, [1, 2])
    for t in range(2, 8):                                       # 6 more 2-token prompts
        tr.put(t, [10 * t, 10 * t + 1])
    pol = tr.pol
    assert pol.recall.limit == 8 and pol.recall.size == 8      # prompts 1-6 evicted, 3-6 remembered
    # prompts 1 and 2 forgotten, never back: one page of each class each (last token, the one before),
    # counted when forgotten and halved every pool (2 tokens) inserted since: 1/2 + 1/4
    assert pol.n == {(2, 0, False): 0.75, (2, 1, False): 0.75} and pol.r == {}


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

    from radixui.replay import empty_snapshot, replay

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
        assert dataclasses.replace(got, eviction_order=()) == dataclasses.replace(tr.cache.snapshot(), eviction_order=())
