"""Tests written to kill the mutants `scripts/mutants.py` found surviving (each names the bug it catches).

Each one pins a behaviour the rest of the suite left open: exact results of the lock-free peek, the
cumulative eviction metric, dtypes at the entry, slot tensors that must outlive later frees, what a
split carries over, and what the event log records for an unaligned key.
"""
from __future__ import annotations

import pytest
import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import LogicalClock, RadixCache, RadixKey
from core.observe.invariants import check_cache_invariants
from core.observe.snapshot import snapshot_cache

EMPTY = torch.empty(0, dtype=torch.int64)


def make(slots: int = 32, ps: int = 1, **kw):
    clock = LogicalClock()
    alloc = SlotAllocator(slots, page_size=ps)
    return RadixCache(alloc, page_size=ps, clock=clock, **kw), alloc, clock


def put(cache: RadixCache, tokens, priority: int = 0) -> torch.Tensor:
    """The finished-request flow; returns the slots now holding `tokens` (whole pages)."""
    key = RadixKey(tokens)
    m = cache.match_prefix(key)
    cache.inc_lock_ref(m.last_node)
    ps = cache.page_size
    need = -(-(len(tokens) - m.indices.numel()) // ps) * ps
    new = cache.allocator.alloc(need) if need else EMPTY
    value = torch.cat([m.indices, new])[:len(tokens)]
    got = cache.insert(key, value, priority=priority)
    p = m.indices.numel()
    cache.allocator.free(new[:got - p])
    cache.allocator.free(new[len(tokens) - len(tokens) % ps - p:])
    cache.dec_lock_ref(m.last_node)
    check_cache_invariants(cache, EMPTY)
    return value[:len(tokens) - len(tokens) % ps]


def test_peek_prefix_len_is_exact_and_changes_nothing():
    """peek-partial-page / peek-counts-whole-edge: the scheduler's lpm order depends on these numbers."""
    cache, _, clock = make(32, ps=2)
    put(cache, [1, 2, 3, 4, 5, 6])
    clock.tick()
    before = snapshot_cache(cache).to_dict()
    assert cache.peek_prefix_len(RadixKey([1, 2, 3, 4, 5, 6, 7, 8])) == 6     # the whole edge, then nothing
    assert cache.peek_prefix_len(RadixKey([1, 2, 3, 4, 9, 9])) == 4           # stops mid-edge, page-aligned
    assert cache.peek_prefix_len(RadixKey([1, 2, 3, 9])) == 2                 # differs inside page 2
    assert cache.peek_prefix_len(RadixKey([1, 2, 3])) == 2                    # a partial last page never counts
    assert cache.peek_prefix_len(RadixKey([1])) == 0
    assert cache.peek_prefix_len(RadixKey([1, 2], "other")) == 0
    assert snapshot_cache(cache).to_dict() == before                                # no split, stamp or hit
    assert len(cache.nodes()) == 2 and cache.nodes()[1].hit_count == 1                # put's own insert


def test_evicted_tokens_is_cumulative_over_evict_calls():
    """delete-no-evicted-count: the engine's evicted_tokens metric."""
    cache, _, clock = make(16)
    put(cache, [1, 2, 3])
    clock.tick()
    put(cache, [7, 8])
    assert cache.evicted_tokens == 0
    assert cache.evict(1) == 3 and cache.evicted_tokens == 3     # LRU: [1,2,3], whole leaf
    assert cache.evict(5) == 2 and cache.evicted_tokens == 5
    assert cache.evict(5) == 0 and cache.evicted_tokens == 5     # nothing left
    cache.reset()
    assert cache.evicted_tokens == 0


def test_insert_converts_the_value_to_int32_slots():
    """insert-no-dtype: an int64 slot tensor from a caller is stored (and matched) as int32."""
    cache, alloc, _ = make(8)
    v = alloc.alloc(3).to(torch.int64)
    assert cache.insert(RadixKey([4, 5, 6]), v) == 0
    leaf = cache.root_node.children[4]
    assert leaf.value.dtype == torch.int32 and leaf.value.tolist() == [1, 2, 3]
    m = cache.match_prefix(RadixKey([4, 5]))
    assert m.indices.dtype == torch.int32 and m.indices.tolist() == [1, 2]
    check_cache_invariants(cache, EMPTY)


@pytest.mark.parametrize("store", ["runs", "ring"])
def test_allocated_slots_survive_later_frees_that_compact_the_ring(store):
    """alloc-view / ring-take-view: a tensor alloc returned must not change when the allocator reuses its
    buffer (the run ring's records, the ring store's pages)."""
    a = SlotAllocator(6, store=store)
    kept = a.alloc(2)
    assert kept.tolist() == [1, 2]
    for _ in range(20):                      # churn through the rest: the ring is compacted many times
        got = a.alloc(4)
        a.free(got.flip(0))
    assert kept.tolist() == [1, 2]
    a.free(kept)
    assert sorted(a.free_pages.tolist()) == [1, 2, 3, 4, 5, 6]


def test_split_keeps_priority_and_counts_on_both_halves():
    """split-no-priority: a split-off prefix keeps the priority its request inserted it with."""
    cache, _, clock = make(16, eviction_policy="priority")
    put(cache, [1, 2, 3, 4], priority=2)
    clock.tick()
    put(cache, [9, 9])                        # priority 0, newer
    clock.tick()
    m = cache.match_prefix(RadixKey([1, 2, 7]))          # splits [1,2,3,4] after 2 tokens
    prefix = m.last_node
    assert prefix.key.token_ids.tolist() == [1, 2] and prefix.priority == 2
    assert next(iter(prefix.children.values())).priority == 2
    # priority policy: the low-priority [9,9] goes first although it is newer, then [3,4], then [1,2]
    assert [n.key.token_ids.tolist() for n in cache.eviction_order()] == [[9, 9], [3, 4], [1, 2]]


def test_match_event_counts_only_whole_pages_asked():
    """match-no-align: the event log (dashboard, KV events) reports the page-aligned key it matched."""
    cache, _, _ = make(16, ps=4)
    put(cache, list(range(8)))
    seq = cache.events.last_seq
    m = cache.match_prefix(RadixKey(list(range(11))))
    assert m.indices.numel() == 8
    (ev,) = [e for e in cache.events.since(seq) if e.kind == "match"]
    assert (ev.tokens_asked, ev.tokens_hit) == (8, 8)


def test_split_keeps_the_hit_count_of_the_edge_it_cuts():
    """split-no-hits: LFU must still see a prefix's past hits after a later request splits its edge."""
    cache, _, clock = make(16, eviction_policy="lfu")
    put(cache, [1, 2, 3, 4])
    for _ in range(3):
        clock.tick()
        put(cache, [1, 2, 3, 4])                        # a request over the same tokens: 4 hits in all
    clock.tick()
    put(cache, [8, 8])
    clock.tick()
    put(cache, [1, 2, 9])                               # splits after [1, 2]: a 5th hit on the prefix only
    prefix = cache.match_prefix(RadixKey([1, 2])).last_node
    suffix = prefix.children[3]
    assert (prefix.hit_count, suffix.hit_count) == (5, 4)
    # lfu: [8,8] and [9] (1 hit; [8,8] used first) go before [3,4] (4 hits), then its parent [1,2] (5 hits)
    assert [n.key.token_ids.tolist() for n in cache.eviction_order()] == [[8, 8], [9], [3, 4], [1, 2]]


def test_lfu_breaks_equal_hit_counts_by_last_access_not_by_age():
    """lfu-no-lru-tiebreak: with equal hits, the least recently used leaf goes first, whatever its age."""
    cache, _, clock = make(16, eviction_policy="lfu")
    put(cache, [1, 2])                    # older node
    clock.tick()
    put(cache, [5, 6])
    clock.tick()
    put(cache, [5, 6])                    # two hits each; [1, 2] is used last
    clock.tick()
    put(cache, [1, 2])
    assert [n.key.token_ids.tolist() for n in cache.eviction_order()] == [[5, 6], [1, 2]]
    assert cache.evict(1) == 2 and cache.match_prefix(RadixKey([1, 2])).indices.numel() == 2


def test_a_leaf_added_from_the_root_keeps_its_own_key_object():
    """insert-root-key-shared: insert adds the whole key without slicing it, but the node holds its own
    RadixKey: the caller rebinding its key's token ids afterwards changes nothing in the tree."""
    cache, alloc, _ = make(16)
    key = RadixKey([1, 2, 3])
    v = alloc.alloc(3)
    assert cache.insert(key, v) == 0
    key.token_ids = key.token_ids[:0]          # the caller reuses its key object
    node = cache.root_node.children[1]
    assert node.key is not key and node.key.token_ids.tolist() == [1, 2, 3] and node.value.tolist() == v.tolist()
    assert cache.match_prefix(RadixKey([1, 2, 3])).indices.tolist() == v.tolist()
    check_cache_invariants(cache, EMPTY)


def test_insert_refuses_slot_ids_int32_cannot_hold_and_non_integer_slots():
    """An int64 id past int32 would wrap into another slot, a 2-D or non-tensor value is not one slot per
    token: each refused with what to pass, and the tree is unchanged."""
    cache, alloc, _ = make(8)
    for bad, msg in ((torch.tensor([1, 2, 2**31], dtype=torch.int64), r"outside 0\.\.2147483647"),
                     (torch.tensor([-1, 2, 3], dtype=torch.int64), r"outside 0\.\.2147483647"),
                     (torch.tensor([1.0, 2.0, 3.0]), r"integer slot ids"),
                     (torch.tensor([[1, 2, 3]], dtype=torch.int32), r"1-D slot tensor.*\(1, 3\)"),
                     ([1, 2, 3], r"1-D torch tensor .*got list"), (None, r"got NoneType")):
        with pytest.raises(ValueError, match=msg):
            cache.insert(RadixKey([4, 5, 6]), bad)
        assert cache.root_node.children == {} and cache.total_size() == 0
    check_cache_invariants(cache, EMPTY)


def test_reset_is_refused_while_a_path_is_locked_and_changes_nothing():
    """reset-while-locked: the locked request's slots had gone back to free_pages and were handed out again."""
    cache, alloc, _ = make(16)
    slots = put(cache, [1, 2, 3, 4])
    node = cache.match_prefix(RadixKey([1, 2, 3, 4])).last_node
    assert cache.inc_lock_ref(node) == 4
    free = alloc.available()
    with pytest.raises(ValueError, match="reset with 4 tokens locked by running requests"):
        cache.reset()
    assert alloc.available() == free and cache.match_prefix(RadixKey([1, 2, 3, 4])).indices.tolist() == slots.tolist()
    assert cache.dec_lock_ref(node) == 4
    cache.reset()
    assert alloc.available() == 16 and cache.total_size() == 0
