"""RadixCache unit tests: match/split, insert, namespaces, pages, locks, bad input, the invariant checker."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import LogicalClock, MatchResult, RadixCache, RadixKey
from core.cache.slot_kernels import mark
from core.observe.invariants import InvariantError, check_cache_invariants
from core.observe.snapshot import snapshot_cache

EMPTY = torch.empty(0, dtype=torch.int64)


def make(slots: int = 32, ps: int = 1, **kw):
    clock = LogicalClock()
    alloc = SlotAllocator(slots, page_size=ps)
    return RadixCache(alloc, page_size=ps, clock=clock, **kw), alloc, clock


def cache_prompt(cache: RadixCache, tokens, extra_key=None) -> torch.Tensor:
    """The engine's flow for one finished request; returns the slots now holding the prompt."""
    key = RadixKey(tokens, extra_key)
    m = cache.match_prefix(key)
    cache.inc_lock_ref(m.last_node)
    ps = cache.page_size
    need = len(tokens) - m.indices.numel()
    n = -(-need // ps) * ps
    new = cache.allocator.alloc(n) if n else EMPTY
    value = torch.cat([m.indices, new[:need]])
    got = cache.insert(key, value)
    aligned = len(tokens) - len(tokens) % ps
    p = m.indices.numel()
    cache.allocator.free(new[:got - p])
    cache.allocator.free(new[aligned - p:])
    cache.dec_lock_ref(m.last_node)
    check_cache_invariants(cache, EMPTY)
    return value[:aligned]


def edges(cache: RadixCache) -> dict:
    """token tuple of each edge -> (parent's edge tokens, slots)."""
    out = {}
    for n in cache.nodes()[1:]:
        parent = () if n.parent is cache.root_node else tuple(n.parent.key.token_ids.tolist())
        out[tuple(n.key.token_ids.tolist())] = (parent, n.value.tolist())
    return out


def frozen_state(cache: RadixCache):
    return snapshot_cache(cache).to_dict(), cache.allocator.free_pages.tolist(), cache.allocator.is_free_mask().tolist()


# ----- RadixKey / MatchResult ---------------------------------------------------------------------------
def test_radix_key_accepts_lists_numpy_and_tensors_and_keeps_extra_key_on_slices():
    for ids in ([1, 2, 3], np.array([1, 2, 3], dtype=np.int32), torch.tensor([1, 2, 3])):
        k = RadixKey(ids, "lora-a")
        assert k.token_ids.dtype == np.int64 and k.token_ids.tolist() == [1, 2, 3] and len(k) == 3
        s = k[1:]
        assert s.token_ids.tolist() == [2, 3] and s.extra_key == "lora-a"
    assert "extra_key='t'" in repr(RadixKey(range(20), "t")) and "..." in repr(RadixKey(range(20)))


# ----- match / split -------------------------------------------------------------------------------------
def test_match_on_empty_tree_and_empty_key_returns_root():
    cache, _, _ = make()
    for key in (RadixKey([1, 2]), RadixKey([])):
        m = cache.match_prefix(key)
        assert isinstance(m, MatchResult) and m.last_node is cache.root_node
        assert m.indices.tolist() == [] and m.indices.dtype == torch.int32


def test_match_longer_than_cached_hits_the_whole_edge_without_split():
    cache, _, _ = make()
    slots = cache_prompt(cache, [1, 2, 3])
    seq = cache.events.last_seq
    m = cache.match_prefix(RadixKey([1, 2, 3, 4, 5]))
    assert m.indices.tolist() == slots.tolist() == [1, 2, 3]
    assert m.last_node.key.token_ids.tolist() == [1, 2, 3]
    assert [e.kind for e in cache.events.since(seq)] == ["match"]


@pytest.mark.parametrize("query, hit", [([1, 2], [1, 2]), ([1, 2, 9, 9], [1, 2])])
def test_match_stopping_mid_edge_splits_there(query, hit):
    cache, _, clock = make()
    cache_prompt(cache, [1, 2, 3, 4])
    clock.tick()
    seq = cache.events.last_seq
    m = cache.match_prefix(RadixKey(query))
    assert m.indices.tolist() == hit
    assert m.last_node.key.token_ids.tolist() == [1, 2]
    assert edges(cache) == {(1, 2): ((), [1, 2]), (3, 4): ((1, 2), [3, 4])}
    split = [e for e in cache.events.since(seq) if e.kind == "split"]
    assert [(e.new_parent, e.position) for e in split] == [(m.last_node.id, 2)]
    # both halves are stamped; the split-off prefix is created at the split and carries the edge's hits (as
    # SGLang's _split_node); a match counts no hit (a request's insert does)
    child = next(iter(m.last_node.children.values()))
    assert (m.last_node.last_access_time, child.last_access_time) == (1, 1)
    assert (m.last_node.creation_time, child.creation_time) == (1, 0)
    assert (m.last_node.hit_count, child.hit_count) == (1, 1)
    check_cache_invariants(cache, EMPTY)


def test_match_stamps_every_visited_node_and_a_requests_insert_counts_its_hits():
    cache, _, clock = make()
    cache_prompt(cache, [1, 2, 3, 4])
    cache_prompt(cache, [1, 2, 7, 7])             # splits into [1,2] -> [3,4], [7,7]; [1,2] is on both paths
    clock.t = 5
    cache.match_prefix(RadixKey([1, 2, 3, 4]))    # stamps, counts nothing
    info = {tuple(n.key.token_ids.tolist()): (n.last_access_time, n.hit_count) for n in cache.nodes()[1:]}
    assert info == {(1, 2): (5, 2), (3, 4): (5, 1), (7, 7): (0, 1)}
    assert cache.root_node.last_access_time == 5


# ----- insert ---------------------------------------------------------------------------------------------
def test_insert_returns_cached_length_and_the_caller_frees_duplicates():
    cache, alloc, _ = make(16)
    assert cache.insert(RadixKey([1, 2, 3]), alloc.alloc(3)) == 0
    dup = alloc.alloc(3)                          # a second request computed the same prompt
    assert cache.insert(RadixKey([1, 2, 3]), dup) == 3
    assert edges(cache) == {(1, 2, 3): ((), [1, 2, 3])}
    alloc.free(dup)
    check_cache_invariants(cache, EMPTY)
    # extending a leaf hangs the rest underneath; the old leaf stops being evictable
    ext = torch.cat([torch.tensor([1, 2, 3]), alloc.alloc(2)])
    assert cache.insert(RadixKey([1, 2, 3, 8, 9]), ext) == 3
    assert edges(cache) == {(1, 2, 3): ((), [1, 2, 3]), (8, 9): ((1, 2, 3), [7, 8])}
    assert [n.key.token_ids.tolist() for n in cache.evictable_leaves] == [[8, 9]]
    check_cache_invariants(cache, EMPTY)


def test_insert_of_a_prefix_of_an_edge_splits_and_adds_no_leaf():
    cache, alloc, _ = make(16)
    cache.insert(RadixKey([1, 2, 3, 4]), alloc.alloc(4))
    dup = alloc.alloc(2)
    assert cache.insert(RadixKey([1, 2]), dup) == 2
    alloc.free(dup)
    assert edges(cache) == {(1, 2): ((), [1, 2]), (3, 4): ((1, 2), [3, 4])}
    assert cache.total_size() == 4
    check_cache_invariants(cache, EMPTY)


def test_insert_keeps_the_new_part_of_value_without_a_copy():
    # as SGLang: the tree takes over value[cached:] (the caller must not write into it afterwards)
    cache, alloc, _ = make(8)
    v = alloc.alloc(2)
    cache.insert(RadixKey([1, 2]), v)
    w = torch.cat([v, alloc.alloc(3)])
    assert cache.insert(RadixKey([1, 2, 5, 6, 7]), w) == 2
    leaf = cache.root_node.children[1].children[5]
    assert leaf.value.tolist() == [3, 4, 5] and leaf.value.data_ptr() == w[2:].data_ptr()


def test_insert_copies_a_short_tail_so_the_leaf_does_not_pin_the_whole_tensor():
    cache, alloc, _ = make(64)
    prefix = alloc.alloc(40)
    cache.insert(RadixKey(list(range(40))), prefix)
    w = torch.cat([prefix, alloc.alloc(2)])          # 40 cached slots + 2 new ones
    assert cache.insert(RadixKey(list(range(40)) + [98, 99]), w) == 40
    leaf = cache.root_node.children[0].children[98]
    assert leaf.value.tolist() == w[40:].tolist()
    assert leaf.value.untyped_storage().nbytes() == 2 * 4   # its own two int32 slots, not w's 42
    check_cache_invariants(cache, EMPTY)


def test_indexing_a_key_with_an_int_gives_a_one_token_key():
    k = RadixKey([5, 6, 7], extra_key="a")
    assert k[1].token_ids.tolist() == [6] and len(k[1]) == 1 and k[1].extra_key == "a"
    assert k[1:].token_ids.tolist() == [6, 7]


# ----- extra_key namespaces -------------------------------------------------------------------------------
def test_extra_key_namespaces_never_share_nodes():
    cache, _, _ = make()
    base = cache_prompt(cache, [1, 2, 3])
    lora = cache_prompt(cache, [1, 2, 3], extra_key="lora-a")
    assert base.tolist() == [1, 2, 3] and lora.tolist() == [4, 5, 6]
    assert len(cache.root_node.children) == 2 and cache.total_size() == 6
    assert cache.match_prefix(RadixKey([1, 2, 3], "lora-a")).indices.tolist() == [4, 5, 6]
    assert cache.match_prefix(RadixKey([1, 2], None)).indices.tolist() == [1, 2]
    assert cache.match_prefix(RadixKey([1, 2, 3], "lora-b")).indices.tolist() == []
    # a split inside one namespace leaves the other alone
    assert {n.key.extra_key for n in cache.nodes()[1:]} == {None, "lora-a"}
    assert sorted(len(n.key) for n in cache.nodes()[1:]) == [1, 2, 3]
    check_cache_invariants(cache, EMPTY)


# ----- pages ----------------------------------------------------------------------------------------------
def test_page_size_2_matches_and_inserts_whole_pages_only():
    cache, alloc, _ = make(16, ps=2)
    slots = cache_prompt(cache, [1, 2, 3, 4, 5])  # 5 tokens: only the first 2 pages are cached
    assert slots.tolist() == [2, 3, 4, 5]
    assert edges(cache) == {(1, 2, 3, 4): ((), [2, 3, 4, 5])}
    assert alloc.free_pages.tolist() == [4, 5, 6, 7, 8, 3]   # page 3 (the tail) came back
    # a match never ends inside a page
    assert cache.match_prefix(RadixKey([1, 2, 3])).indices.tolist() == [2, 3]
    assert cache.match_prefix(RadixKey([1])).indices.tolist() == []
    assert edges(cache) == {(1, 2): ((), [2, 3]), (3, 4): ((1, 2), [4, 5])}
    # [1, 3] is a different first page from [1, 2]: a sibling, not a split at token 1
    cache_prompt(cache, [1, 3, 9, 9])
    assert set(cache.root_node.children) == {(1, 2), (1, 3)}
    assert cache.match_prefix(RadixKey([1, 3, 9, 9, 0])).indices.tolist() == [8, 9, 10, 11]
    check_cache_invariants(cache, EMPTY)


def test_page_size_4_split_lands_on_a_page_boundary():
    cache, _, _ = make(16, ps=4)
    cache_prompt(cache, list(range(8)))
    m = cache.match_prefix(RadixKey([0, 1, 2, 3, 4, 5, 99, 99]))  # diverges inside page 2
    assert m.indices.tolist() == [4, 5, 6, 7]
    assert edges(cache) == {(0, 1, 2, 3): ((), [4, 5, 6, 7]), (4, 5, 6, 7): ((0, 1, 2, 3), [8, 9, 10, 11])}
    check_cache_invariants(cache, EMPTY)


def test_cache_and_allocator_page_size_must_agree():
    alloc = SlotAllocator(8, page_size=2)
    with pytest.raises(ValueError, match="pass the same value to both"):
        RadixCache(alloc, page_size=1)
    assert alloc.on_event is None and alloc.free_pages.tolist() == [1, 2, 3, 4]


# ----- disable / reset / clock ----------------------------------------------------------------------------
def test_disabled_cache_never_hits_and_stores_nothing():
    cache, alloc, _ = make(8, disable=True)
    v = alloc.alloc(3)
    assert cache.insert(RadixKey([1, 2, 3]), v) == 0
    m = cache.match_prefix(RadixKey([1, 2, 3]))
    assert m.indices.tolist() == [] and m.last_node is cache.root_node
    assert cache.nodes() == [cache.root_node] and cache.total_size() == 0
    check_cache_invariants(cache, v)


def test_reset_drops_the_tree_and_frees_every_slot():
    cache, alloc, _ = make(8)
    cache_prompt(cache, [1, 2, 3])
    cache_prompt(cache, [1, 5])
    seq = cache.events.last_seq
    cache.reset()
    assert cache.nodes() == [cache.root_node] and cache.evictable_leaves == set()
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (0, 0, 0)
    assert alloc.free_pages.tolist() == list(range(1, 9))
    assert [e.kind for e in cache.events.since(seq)] == ["reset"]
    assert cache.match_prefix(RadixKey([1, 2, 3])).indices.tolist() == []
    check_cache_invariants(cache, EMPTY)


def test_default_clock_is_a_logical_counter_the_caller_advances():
    cache = RadixCache(SlotAllocator(8))
    assert cache.clock() == 0
    assert cache.tick() == 1 and cache.tick() == 2 and cache.clock() == 2
    cache_prompt(cache, [4, 4])
    assert cache.nodes()[1].creation_time == 2


# ----- locks --------------------------------------------------------------------------------------------------
def test_lock_moves_tokens_between_evictable_and_protected():
    cache, _, _ = make()
    cache_prompt(cache, [1, 2, 3, 4])
    cache_prompt(cache, [1, 2, 7])
    leaf = cache.match_prefix(RadixKey([1, 2, 7])).last_node
    assert cache.inc_lock_ref(leaf) == 3                # [1,2] and [7] become protected
    assert (cache.evictable_size(), cache.protected_size()) == (2, 3)
    assert cache.inc_lock_ref(leaf) == 0                # already protected
    assert leaf.lock_ref == 2 and leaf.parent.lock_ref == 2
    assert leaf not in cache.evictable_leaves
    assert cache.dec_lock_ref(leaf) == 0
    assert cache.dec_lock_ref(leaf) == 3
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    assert leaf in cache.evictable_leaves
    check_cache_invariants(cache, EMPTY)


# ----- bad input: ValueError that says what to change, cache unchanged ---------------------------------------
def test_insert_with_key_and_value_of_different_lengths():
    cache, alloc, _ = make(8)
    cache_prompt(cache, [1, 2])
    v = alloc.alloc(2)
    before = frozen_state(cache)
    with pytest.raises(ValueError, match="key has 3 tokens but value has 2 slots; pass one slot per token"):
        cache.insert(RadixKey([1, 2, 3]), v)
    assert frozen_state(cache) == before
    check_cache_invariants(cache, v)


def test_dec_lock_ref_below_zero_changes_nothing():
    cache, _, _ = make()
    cache_prompt(cache, [1, 2, 3, 4])
    cache_prompt(cache, [1, 2, 7])
    leaf = cache.match_prefix(RadixKey([1, 2, 7])).last_node
    before = frozen_state(cache)
    with pytest.raises(ValueError, match="needs an earlier inc_lock_ref"):
        cache.dec_lock_ref(leaf)                         # never locked
    assert frozen_state(cache) == before
    # the parent is locked (by another request), the child is not: still rejected, parent untouched
    parent = leaf.parent
    cache.inc_lock_ref(parent)
    before = frozen_state(cache)
    with pytest.raises(ValueError, match=f"node {leaf.id} whose lock_ref is already 0"):
        cache.dec_lock_ref(leaf)
    assert frozen_state(cache) == before and parent.lock_ref == 1
    cache.dec_lock_ref(parent)
    check_cache_invariants(cache, EMPTY)


def test_dec_lock_ref_on_the_root_is_a_no_op():
    cache, _, _ = make()
    before = frozen_state(cache)
    assert cache.dec_lock_ref(cache.root_node) == 0 and cache.inc_lock_ref(cache.root_node) == 0
    assert frozen_state(cache) == before


def test_inc_lock_ref_on_an_evicted_node_is_rejected_and_changes_nothing():
    cache, _, _ = make()
    cache_prompt(cache, [1, 2, 3])
    stale = cache.match_prefix(RadixKey([1, 2, 3])).last_node
    assert cache.evict(3) == 3
    before = frozen_state(cache)
    with pytest.raises(ValueError, match="no longer in the tree.*match_prefix again"):
        cache.inc_lock_ref(stale)
    assert frozen_state(cache) == before
    check_cache_invariants(cache, EMPTY)


# ----- the invariant checker fails when it should ---------------------------------------------------------------
def _tree():
    cache, alloc, _ = make(16)
    cache_prompt(cache, [1, 2, 3, 4])
    cache_prompt(cache, [1, 2, 7])
    return cache, alloc


def _append_free_page_raw(a, page: int) -> None:
    """Put `page` at the back of free_pages behind the allocator's back (its free state untouched)."""
    st = a._store
    st._starts[st._tail], st._lengths[st._tail] = page, 1
    st._tail += 1
    st._count += 1


CORRUPTIONS = {
    "lock_ref": (lambda c, a: setattr(c.nodes()[2], "lock_ref", -1), "lock_ref -1 < 0"),
    "value length": (lambda c, a: setattr(c.nodes()[2], "value", c.nodes()[2].value[:1]), "key has 2 tokens, value 1"),
    "sizes": (lambda c, a: setattr(c, "_evictable_size", 4), "evictable_size is 4"),
    "leaves": (lambda c, a: c.evictable_leaves.discard(c.nodes()[2]), "evictable_leaves"),
    "child key": (lambda c, a: c.root_node.children.__setitem__(5, c.root_node.children.pop(1)),
                  "first token"),
    "slot twice": (lambda c, a: _append_free_page_raw(a, 1), "slot 1 is owned twice"),
    "leaked slot": (lambda c, a: a.alloc(1), "slot conservation broken"),     # handed out, owned by nobody
    "free mask": (lambda c, a: mark(a._store._free, int(a.free_pages[0]), 1, False), "free mask disagrees"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_check_invariants_catches(name):
    cache, alloc = _tree()
    check_cache_invariants(cache, EMPTY)
    corrupt, msg = CORRUPTIONS[name]
    corrupt(cache, alloc)
    with pytest.raises(InvariantError, match=msg):
        check_cache_invariants(cache, EMPTY)


def test_check_invariants_counts_slots_held_by_callers():
    cache, alloc = _tree()
    held = alloc.alloc(3)
    check_cache_invariants(cache, held)
    with pytest.raises(InvariantError, match="slot conservation"):
        check_cache_invariants(cache, held[:2])              # a slot nobody owns: a leak
    with pytest.raises(InvariantError, match="owned twice"):
        check_cache_invariants(cache, torch.cat([held, torch.tensor([1])]))  # a caller holding a tree slot

