import numpy as np
import pytest
import torch

from core.cache.allocator import SlotAllocator
from core.cache.events import ResetEvent
from core.cache.radix_cache import RadixCache, RadixKey
from core.observe.invariants import check_cache_invariants
from core.observe.snapshot import snapshot_cache
from core.observe.time_travel import CacheModel, Replayer, empty_snapshot, replay
from tests.article_cache import run_request


def test_replaying_the_article_equals_the_cache(walk):
    cache, _, steps = walk
    events = list(cache.events)
    assert replay(empty_snapshot(11), events) == snapshot_cache(cache)
    for st in steps:   # and after every step
        assert replay(empty_snapshot(11), events, upto_seq=st.snapshot.seq) == st.snapshot


def test_replayer_back_and_forth_and_pools(walk):
    cache, tok, steps = walk
    r = Replayer(empty_snapshot(11), list(cache.events), checkpoint_every=4)
    for st in list(reversed(steps)) + steps:
        assert r.at(st.snapshot.seq) == st.snapshot
        np.testing.assert_array_equal(r.pool_at(st.snapshot.seq).states, st.pool.states)
        np.testing.assert_array_equal(r.pool_at(st.snapshot.seq).slot_tokens, st.pool.slot_tokens)
    assert r.first_seq == 0 and r.last_seq == cache.events.last_seq
    # mid-step: after the eviction at time 3, before the alloc, slots 6-9 are free and node 3 gone
    mid = r.at(20)
    assert 3 not in {n.id for n in mid.nodes} and mid.free_pages == (6, 7, 8, 9)
    assert [e.seq for e in r.events_between(18, 20)] == [19, 20]


def test_pool_at_marks_slots_held_by_running_requests():
    cache = RadixCache(SlotAllocator(8))
    seq0 = cache.events.last_seq
    run_request(cache, [1, 2, 3])
    held = cache.allocator.alloc(2)     # a running request's decode slots, not in the tree yet
    r = Replayer(empty_snapshot(8), cache.events.since(seq0 - 1))
    pool = r.pool_at(cache.events.last_seq)
    assert pool.states[held.tolist()].tolist() == [5, 5]     # IN_USE
    assert r.at(cache.events.last_seq) == snapshot_cache(cache)


def workload(seed, policy="lru", page_size=1, steps=60):
    """Random requests over a tiny vocabulary on a small pool: splits, evictions, and requests that
    stay running (locked) across steps. Yields the cache after each step."""
    rng = np.random.default_rng(seed)
    alloc = SlotAllocator(64 * page_size, page_size=page_size)
    cache = RadixCache(alloc, page_size=page_size, eviction_policy=policy)
    running = []   # (last_node, held slots)
    prefixes = [list(rng.integers(0, 3, size=page_size * int(rng.integers(1, 4)))) for _ in range(4)]
    for step in range(steps):
        cache.tick()
        if running and rng.random() < 0.5:       # finish a running request
            node, slots = running.pop(int(rng.integers(0, len(running))))
            cache.dec_lock_ref(node)
            alloc.free(slots)
        ids = prefixes[int(rng.integers(0, 4))] + list(rng.integers(0, 5, size=page_size * int(rng.integers(1, 5))))
        ids += [int(1000 + step)] * page_size      # a fresh tail: every insert adds a leaf
        key = RadixKey(ids)
        m = cache.match_prefix(key)
        cache.inc_lock_ref(m.last_node)
        need = len(ids) - m.indices.numel()
        slots = alloc.alloc(need)
        if slots is None:
            cache.evict(need - alloc.available())
            slots = alloc.alloc(need)
        if slots is None:                           # everything locked: give up this request
            cache.dec_lock_ref(m.last_node)
            yield cache, running
            continue
        value = torch.cat([m.indices, slots])
        n = cache.insert(key, value, inserted_len=int(rng.integers(0, len(ids))))   # hits past it count
        if n > m.indices.numel():
            alloc.free(value[m.indices.numel():n])
        cache.dec_lock_ref(m.last_node)
        if rng.random() < 0.4:                      # keep it running: lock its path, hold decode slots
            node = cache.match_prefix(key).last_node
            cache.inc_lock_ref(node)
            extra = alloc.alloc(page_size)
            if extra is None:
                cache.dec_lock_ref(node)
            else:
                running.append((node, extra))
        yield cache, running


@pytest.mark.parametrize("seed, policy, page_size", [(0, "lru", 1), (1, "lfu", 1), (2, "fifo", 1),
                                                      (3, "slru", 1), (4, "lru", 2), (5, "mru", 1)])
def test_replay_matches_a_random_run_at_every_step(seed, policy, page_size):
    snaps = []
    cache = None
    evicted = 0
    for cache, running in workload(seed, policy, page_size):
        snaps.append(snapshot_cache(cache))
        held = torch.cat([s for _, s in running]) if running else None
        check_cache_invariants(cache, held)
    events = list(cache.events)
    evicted = sum(1 for e in events if e.kind == "evict")
    assert evicted > 0 and any(e.kind == "split" for e in events)
    r = Replayer(empty_snapshot(cache.allocator.num_slots, page_size, policy), events, checkpoint_every=50)
    for snap in snaps:
        got = r.at(snap.seq)
        assert got.nodes == snap.nodes
        assert got.free_pages == snap.free_pages
        assert got.eviction_order == snap.eviction_order
        assert got == snap


def test_an_insert_that_adds_nothing_replays_its_touch():
    """Insert a prefix that is cached already, later: the cache stamps the path (a `touch` event)
    and LRU then evicts the other branch first; the replay must stamp the same times."""
    alloc = SlotAllocator(16)
    cache = RadixCache(alloc)
    for ids in ([1, 2, 3], [1, 2, 3, 4, 5], [7, 8]):
        cache.tick()
        m = cache.match_prefix(RadixKey(ids))
        slots = alloc.alloc(len(ids) - m.indices.numel())
        cache.insert(RadixKey(ids), torch.cat([m.indices, slots]))
    cache.tick()
    slots = alloc.alloc(3)
    assert cache.insert(RadixKey([1, 2, 3]), slots) == 3     # all cached: nothing added, the path touched
    alloc.free(slots)
    events = list(cache.events)
    assert [e.kind for e in events][-2:] == ["touch", "free"]
    snap = snapshot_cache(cache)
    got = replay(empty_snapshot(16), events)
    assert [n.last_access_time for n in got.nodes] == [n.last_access_time for n in snap.nodes]
    assert got.eviction_order == snap.eviction_order and got == snap
    touched = next(n for n in snap.nodes if list(n.token_ids) == [1, 2, 3])
    assert touched.last_access_time == 4 and snap.eviction_order[0] != touched.id


def test_replay_from_a_later_snapshot(walk):
    cache, _, steps = walk
    events = list(cache.events)
    assert replay(steps[1].snapshot, events) == snapshot_cache(cache)


def test_missing_events_are_an_error(walk):
    cache, _, _ = walk
    events = list(cache.events)[5:]
    with pytest.raises(ValueError, match="events are missing"):
        replay(empty_snapshot(11), events)


def test_reset_event_empties_the_model(walk):
    cache, _, steps = walk
    model = CacheModel(steps[3].snapshot)
    model.apply(ResetEvent(seq=steps[3].snapshot.seq + 1, time=4))
    snap = model.snapshot()
    assert [n.id for n in snap.nodes] == [0] and snap.free_pages == tuple(range(1, 12))
