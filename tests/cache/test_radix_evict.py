"""The eviction heaps (core/cache/radix_evict.py): the one the monotone key policies keep across calls, and the
per-call one the others rebuild; both must take exactly the leaf the policy names, parents included."""
from __future__ import annotations

from core.cache.radix_cache import RadixKey
from core.observe.invariants import check_cache_invariants
from tests.cache.test_radix_cache import EMPTY, cache_prompt, make


def test_kept_heap_takes_a_leaf_touched_after_its_push_at_its_new_key():
    """LRU keeps one heap across evict calls: [1, 2] is pushed first, then matched again (no lock), so its
    entry is stale; evict must still take [3, 4], the least recently used leaf, and only it."""
    cache, alloc, clock = make(8)
    a = cache_prompt(cache, [1, 2]).tolist()
    clock.tick()
    b = cache_prompt(cache, [3, 4]).tolist()
    clock.tick()
    cache.match_prefix(RadixKey([1, 2]))        # touch: [1, 2] is now the most recent
    assert cache.evict(2) == 2
    assert [n.key.token_ids.tolist() for n in cache.nodes() if n is not cache.root_node] == [[1, 2]]
    assert sorted(alloc.free_pages.tolist()) == sorted(set(range(1, 9)) - set(a)) and b[0] in alloc.free_pages.tolist()
    check_cache_invariants(cache, EMPTY)


def test_kept_heap_stays_bounded_when_leaves_are_locked_and_unlocked_without_eviction():
    """Every unlock pushes the leaf again; entries of a leaf locked since are dropped only when popped or
    when the heap is rebuilt. 5,000 lock/unlock cycles on a pool that never fills must not grow it."""
    cache, _, clock = make(16)
    cache_prompt(cache, [1, 2])
    cache_prompt(cache, [3, 4])
    for _ in range(5000):
        m = cache.match_prefix(RadixKey([1, 2]))
        cache.inc_lock_ref(m.last_node)
        cache.dec_lock_ref(m.last_node)
        clock.tick()
    assert len(cache.evictable_leaves) == 2
    assert len(cache._lazy_heap) <= 2 * 2 + 64
    assert cache.evict(2) == 2 and [n.key.token_ids.tolist() for n in cache.nodes()[1:]] == [[1, 2]]


def test_policies_whose_keys_can_shrink_rebuild_their_heap_every_call():
    """mru's key (-last_access_time) drops when a leaf is touched: a kept heap would pick wrong, so only
    the monotone key policies keep one."""
    for policy, kept in [("lru", True), ("lfu", True), ("fifo", True), ("filo", True), ("priority", True),
                         ("slru", True), ("mru", False), ("arc", False), ("recall-value", False)]:
        cache, _, _ = make(8, eviction_policy=policy)
        assert (cache._lazy_heap is not None) is kept, policy
    cache, _, clock = make(8, eviction_policy="mru")
    cache_prompt(cache, [1, 2])
    clock.tick()
    cache_prompt(cache, [3, 4])
    clock.tick()
    cache.match_prefix(RadixKey([1, 2]))        # now [1, 2] is the most recently used: mru takes it
    assert cache.evict(2) == 2
    assert [n.key.token_ids.tolist() for n in cache.nodes()[1:]] == [[3, 4]]



def test_a_parent_left_childless_goes_in_the_same_call_on_the_rebuilt_heap():
    """mru rebuilds its heap per call: [1, 2] loses both children in one evict(6) and must go too."""
    for policy in ("mru", "lru", "arc"):
        cache, alloc, _ = make(8, eviction_policy=policy)
        cache_prompt(cache, [1, 2, 3, 4])
        cache_prompt(cache, [1, 2, 5, 6])
        assert cache.evict(6) == 6, policy
        assert cache.nodes() == [cache.root_node] and alloc.available() == 8, policy
