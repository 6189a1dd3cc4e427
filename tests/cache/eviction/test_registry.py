"""Eviction policies with exact expectations: which leaf goes first, and in which order after that."""
from __future__ import annotations

import pytest
import torch

from core.cache.allocator import SlotAllocator
from core.cache.eviction.registry import DESCRIPTIONS, POLICIES, get_policy
from core.cache.radix_cache import RadixCache, RadixKey
from core.observe.invariants import check_cache_invariants

ALL = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]
NEW = ["gdsf", "arc", "s3fifo", "lecar", "lhd", "recall", "recall-value", "lrb", "lrb-arc"]   # stateful: tests/cache/eviction/test_classic.py, tests/cache/eviction/test_learned.py


class Tree:
    """A cache with an injected clock and helpers that cache / touch whole prompts."""

    def __init__(self, policy: str, slots: int = 32) -> None:
        self.t = 0
        self.alloc = SlotAllocator(slots)
        self.cache = RadixCache(self.alloc, eviction_policy=policy, clock=lambda: self.t)

    def put(self, t: float, tokens: list[int], priority: int = 0) -> None:
        self.t = t
        key = RadixKey(tokens)
        m = self.cache.match_prefix(key)
        self.cache.inc_lock_ref(m.last_node)
        new = self.alloc.alloc(len(tokens) - m.indices.numel()) if len(tokens) > m.indices.numel() else None
        value = torch.cat([m.indices, new]) if new is not None else m.indices
        got = self.cache.insert(key, value, priority=priority)
        self.alloc.free(value[m.indices.numel():got])
        self.cache.dec_lock_ref(m.last_node)
        check_cache_invariants(self.cache)

    def hit(self, t: float, tokens: list[int]) -> None:
        self.t = t
        self.cache.match_prefix(RadixKey(tokens))

    def order(self) -> list[tuple[int, ...]]:
        return [tuple(n.key.token_ids.tolist()) for n in self.cache.eviction_order()]

    def evict_all(self) -> list[tuple[int, ...]]:
        seq = self.cache.events.last_seq
        self.cache.evict(10 ** 6)
        check_cache_invariants(self.cache)
        return [e.token_ids for e in self.cache.events.since(seq) if e.kind == "evict"]


def three(policy: str) -> Tree:
    """A=[1,1] at t0, B=[2,2] at t1, C=[3,3] at t2: three leaves under the root."""
    tr = Tree(policy)
    tr.put(0, [1, 1])
    tr.put(1, [2, 2])
    tr.put(2, [3, 3])
    return tr


A, B, C, D = (1, 1), (2, 2), (3, 3), (4, 4)


def test_lru_least_recently_used_first():
    tr = three("lru")
    tr.hit(3, [1, 1])
    assert tr.order() == [B, C, A]
    assert tr.evict_all() == [B, C, A]


def test_lfu_fewest_hits_then_oldest_access():
    """A hit is a request's insert over the node (SGLang 0.5.23 counts in insert): a bare match counts none."""
    tr = three("lfu")
    tr.put(3, [3, 3])
    tr.put(4, [3, 3])
    tr.put(5, [1, 1])
    tr.hit(5, [2, 2, 7])                 # a match alone: stamped, not counted
    tr.put(6, [4, 4])                    # 1 hit, as B, but newer than B
    hits = {tuple(n.key.token_ids.tolist()): n.hit_count for n in tr.cache.evictable_leaves}
    assert hits == {A: 2, B: 1, C: 3, D: 1}
    assert tr.order() == [B, D, A, C]
    assert tr.evict_all() == [B, D, A, C]


def test_fifo_by_creation_and_a_split_head_is_created_at_the_split_as_in_sglang():
    tr = Tree("fifo")
    tr.put(0, [1, 2, 3])
    tr.put(1, [5, 5])
    tr.put(2, [1, 9])                    # splits [1,2,3]: the head [1] is new at 2, the tail [2,3] keeps 0
    tr.hit(3, [1, 2, 3])                 # access does not matter for fifo
    created = {tuple(n.key.token_ids.tolist()): n.creation_time for n in tr.cache.nodes()[1:]}
    assert created == {(1,): 2, (2, 3): 0, (9,): 2, (5, 5): 1}
    assert tr.order() == [(2, 3), (5, 5), (9,), (1,)]
    assert tr.evict_all() == [(2, 3), (5, 5), (9,), (1,)]


def test_mru_most_recently_used_first():
    tr = three("mru")
    tr.hit(3, [1, 1])
    assert tr.order() == [A, C, B]
    assert tr.evict_all() == [A, C, B]


def test_filo_newest_created_first():
    tr = three("filo")
    tr.hit(3, [1, 1])
    assert tr.order() == [C, B, A]
    assert tr.evict_all() == [C, B, A]


def test_priority_lowest_priority_then_lru_and_reinsert_raises_it():
    tr = Tree("priority")
    tr.put(0, [1, 1], priority=2)
    tr.put(1, [2, 2], priority=0)
    tr.put(2, [3, 3], priority=1)
    tr.put(3, [4, 4], priority=0)
    assert tr.order() == [B, D, C, A]
    tr.put(4, [2, 2], priority=5)        # the same prompt at a higher priority lifts the node
    tr.put(5, [1, 1], priority=0)        # ... but a lower one never lowers it
    prio = {tuple(n.key.token_ids.tolist()): n.priority for n in tr.cache.nodes()[1:]}
    assert prio == {A: 2, B: 5, C: 1, D: 0}
    assert tr.evict_all() == [D, C, A, B]


def test_slru_nodes_hit_twice_are_protected():
    """Each request counts one hit on its path when it inserts (SGLang 0.5.23): a second request protects."""
    tr = three("slru")
    tr.put(4, [1, 1])                    # A: a second request -> 2 hits -> protected segment
    tr.hit(5, [2, 2])                    # B: a match alone, 1 hit -> still probationary, but most recent
    assert [n.hit_count for n in sorted(tr.cache.evictable_leaves, key=lambda n: n.id)] == [2, 1, 1]
    assert tr.order() == [C, B, A]
    assert tr.evict_all() == [C, B, A]
    # the same history under plain lru would take A before B
    lru = three("lru")
    lru.put(4, [1, 1])
    lru.hit(5, [2, 2])
    assert lru.order() == [C, A, B]


def test_parent_becomes_evictable_after_its_last_child_and_competes_in_the_same_heap():
    tr = Tree("lru")
    tr.put(0, [9, 1, 1])
    tr.put(1, [9, 2, 2])                 # split: P=[9], X=[1,1], Y=[2,2], all at t1
    tr.put(2, [5, 5])                    # Z at t2
    tr.hit(3, [9, 1, 1])                 # P and X at t3
    tr.put(4, [7, 7])                    # W at t4
    assert {tuple(n.key.token_ids.tolist()) for n in tr.cache.evictable_leaves} == {(1, 1), (2, 2), (5, 5), (7, 7)}
    # P (t3) is not a leaf yet; once X and Y are gone it joins the heap and goes before W (t4)
    assert tr.order() == [(2, 2), (5, 5), (1, 1), (9,), (7, 7)]
    assert tr.evict_all() == [(2, 2), (5, 5), (1, 1), (9,), (7, 7)]


def test_evict_stops_once_enough_is_freed_whole_leaves_only():
    tr = three("lru")
    seq = tr.cache.events.last_seq
    assert tr.cache.evict(1) == 2          # one whole leaf, though one slot was asked
    assert tr.cache.evict(3) == 4          # two leaves
    assert [e.token_ids for e in tr.cache.events.since(seq) if e.kind == "evict"] == [A, B, C]
    assert tr.cache.evict(0) == 0 and tr.cache.evict(-5) == 0
    assert tr.cache.evict(1) == 0          # nothing left
    assert tr.cache.total_size() == 0 and tr.alloc.available() == 32


def test_locked_paths_never_go_and_their_parent_waits_for_unlock():
    tr = Tree("lru")
    tr.put(0, [9, 1, 1])
    tr.put(1, [9, 2, 2])
    tr.put(2, [5, 5])
    m = tr.cache.match_prefix(RadixKey([9, 1, 1]))
    tr.cache.inc_lock_ref(m.last_node)
    assert tr.order() == [(2, 2), (5, 5)]
    assert tr.evict_all() == [(2, 2), (5, 5)]
    assert tr.cache.total_size() == 3 and tr.cache.protected_size() == 3 and tr.cache.evictable_size() == 0
    tr.cache.dec_lock_ref(m.last_node)
    assert tr.order() == [(1, 1), (9,)]
    assert tr.evict_all() == [(1, 1), (9,)]


# After three() and a match of B at t3 (hit counts A1 B1 C1: each put's insert counts one, a match none;
# created 0/1/2, last used 0/3/2), the victim and its key worked out by hand from each policy's definition,
# not from the cache's code.
EXPECTED_FIRST_VICTIM = {
    "lru": (A, (0.0,)),                  # oldest access
    "lfu": (A, (1.0, 0.0)),              # 1 hit (as all), oldest access
    "fifo": (A, (0.0,)),                 # created first
    "mru": (B, (-3.0,)),                 # newest access
    "filo": (C, (-2.0,)),                # created last
    "priority": (A, (0.0, 0.0)),         # all priority 0: oldest access
    "slru": (A, (0.0, 0.0)),             # probationary (< 2 hits), oldest access
    "arc": (A, (0.0, 0.0)),              # T1 = {A, C}, 4 tokens > p = 0: T1 first, oldest access
    "s3fifo": (A, (0.0, 2.0)),           # small queue 4 tokens > 10 % of 32: FIFO, A came in at 2 tokens
    "gdsf": (A, (0.0, 0.0)),             # value L + hits = 0 (with C), older access
    "lhd": (A, (0.0, 0.0)),              # no density learned yet (6 of 8 tokens before the first update)
    "lecar": (A, (0.0, 0.0)),            # equal weights: the arc expert, as arc
    "recall": (A, (0.0, 0.0)),           # as arc: nothing evicted yet, so nothing recalled
}                                        # (recall-value frees tails: tests/cache/eviction/test_recall.py)


@pytest.mark.parametrize("policy", list(EXPECTED_FIRST_VICTIM))
def test_evict_event_carries_the_policy_key(policy):
    tr = three(policy)
    tr.hit(3, [2, 2])
    tokens, key = EXPECTED_FIRST_VICTIM[policy]
    last_access = {A: 0, B: 3, C: 2}[tokens]
    seq = tr.cache.events.last_seq
    assert tr.cache.evict(1) == 2
    (ev,) = [e for e in tr.cache.events.since(seq) if e.kind == "evict"]
    assert ev.token_ids == tokens and ev.policy_key == key
    assert ev.last_access_time == last_access


def test_policy_registry_and_unknown_name():
    assert list(POLICIES) == ALL + NEW and set(DESCRIPTIONS) == set(ALL + NEW)
    for bad in ["LRU", "random", "", None]:
        with pytest.raises(ValueError) as err:
            get_policy(bad)
        assert all(name in str(err.value) for name in ALL + NEW)


def test_unknown_policy_leaves_the_allocator_unchanged():
    alloc = SlotAllocator(8)
    alloc.alloc(3)
    with pytest.raises(ValueError, match="lru, lfu, fifo, mru, filo, priority, slru, gdsf, arc, s3fifo, lecar, lhd, recall, recall-value"):
        RadixCache(alloc, eviction_policy="lru2")
    assert alloc.free_pages.tolist() == [4, 5, 6, 7, 8] and alloc.on_event is None


def test_lru_cache_agrees_with_the_benchmarks_independent_per_token_tree():
    """Differential test: the plain-Python baseline of benchmarks/bench_radix.py, same flow, many evictions."""
    import numpy as np

    from benchmarks.bench_radix import run_whole

    rng = np.random.default_rng(7)
    stems = [rng.integers(0, 50, size=int(rng.integers(5, 60))) for _ in range(12)]
    prompts = []
    for _ in range(400):
        stem = stems[int(rng.integers(0, len(stems)))][: int(rng.integers(0, 60))]
        tail = rng.integers(0, 50, size=int(rng.integers(1, 40)))
        prompts.append(np.concatenate([stem, tail]).astype(np.int64))
    fast = run_whole("radix", prompts, 400)["result"]
    slow = run_whole("loop", [p.tolist() for p in prompts], 400)["result"]
    assert fast == slow
    assert fast["hit"] > 2000 and fast["evicted"] > 5000      # the case exercises hits and evictions
