"""Snapshots: immutable, JSON-serialisable, and a faithful copy of the cache at one moment."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.observe.snapshot import (
    SLOT_STATES,
    CacheSnapshot,
    EngineSnapshot,
    forget_snapshots,
    PoolView,
    RequestView,
    frozen_array,
    slot_states,
    snapshot_cache,
)


def built(ps: int = 1):
    t = [0]
    alloc = SlotAllocator(12 * ps, page_size=ps)
    cache = RadixCache(alloc, page_size=ps, eviction_policy="lfu", clock=lambda: t[0])
    cache.insert(RadixKey([1] * ps + [2] * ps, "tenant"), alloc.alloc(2 * ps))
    t[0] = 1
    cache.insert(RadixKey([1] * ps + [3] * ps, "tenant"), torch.cat([torch.arange(ps, 2 * ps), alloc.alloc(ps)]))
    # the second prompt reuses the first page's slots as its prefix, so there is no duplicate to free
    return cache, alloc, t


def test_snapshot_contents():
    cache, alloc, t = built()
    snap = snapshot_cache(cache)
    assert isinstance(snap, CacheSnapshot)
    assert (snap.policy, snap.page_size, snap.num_slots, snap.time) == ("lfu", 1, 12, 1)
    assert snap.nodes[0].id == snap.root_id and snap.nodes[0].parent is None and snap.nodes[0].lock_ref == 0
    ids = [n.id for n in snap.nodes]
    for n in snap.nodes[1:]:
        assert ids.index(n.parent) < ids.index(n.id)          # parents before children
    by_tokens = {n.token_ids: n for n in snap.nodes[1:]}
    assert set(by_tokens) == {(1,), (2,), (3,)}
    assert by_tokens[(1,)].slots == (1,) and by_tokens[(2,)].slots == (2,) and by_tokens[(3,)].slots == (3,)
    assert all(n.extra_key == "tenant" for n in snap.nodes[1:])
    assert by_tokens[(2,)].evictable and by_tokens[(3,)].evictable and not by_tokens[(1,)].evictable
    assert (snap.evictable_size, snap.protected_size, snap.total_size) == (3, 0, 3)
    assert snap.seq == cache.events.last_seq
    assert snap.free_pages == tuple(alloc.free_pages.tolist())
    assert snap.eviction_order == tuple(n.id for n in cache.eviction_order())
    assert snap.node(by_tokens[(3,)].id).token_ids == (3,)
    with pytest.raises(KeyError):
        snap.node(999)


def test_snapshot_is_json_serialisable_and_round_trips():
    cache, _, _ = built()
    m = cache.match_prefix(RadixKey([1, 2], "tenant"))
    cache.inc_lock_ref(m.last_node)
    snap = snapshot_cache(cache)
    d = json.loads(json.dumps(snap.to_dict()))
    assert d["seq"] == snap.seq and d["policy"] == "lfu"
    assert [n["id"] for n in d["nodes"]] == [n.id for n in snap.nodes]
    assert [n["slots"] for n in d["nodes"]] == [list(n.slots) for n in snap.nodes]
    assert [n["lock_ref"] for n in d["nodes"]] == [n.lock_ref for n in snap.nodes]
    assert d["protected_size"] == 2 and d["evictable_size"] == 1


def test_snapshot_is_immutable_and_detached_from_the_cache():
    cache, alloc, t = built()
    snap = snapshot_cache(cache)
    before = json.dumps(snap.to_dict())
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.seq = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.nodes[1].lock_ref = 5
    assert isinstance(snap.nodes, tuple) and isinstance(snap.free_pages, tuple)
    assert all(isinstance(n.slots, tuple) and isinstance(n.token_ids, tuple) for n in snap.nodes)
    # mutate the cache a lot: the old snapshot does not move
    t[0] = 5
    cache.match_prefix(RadixKey([1, 2], "tenant"))
    cache.evict(100)
    cache.insert(RadixKey([9, 9, 9]), alloc.alloc(3))
    assert json.dumps(snap.to_dict()) == before
    assert snapshot_cache(cache).seq > snap.seq


def test_snapshot_free_slots_with_pages():
    cache, alloc, _ = built(ps=2)
    snap = snapshot_cache(cache)
    assert snap.free_pages == tuple(alloc.free_pages.tolist())
    assert snap.free_slots() == tuple(s for p in snap.free_pages for s in (2 * p, 2 * p + 1))
    assert json.dumps(snap.to_dict())


def test_slot_states():
    cache, alloc, _ = built()
    m = cache.match_prefix(RadixKey([1, 3], "tenant"))
    cache.inc_lock_ref(m.last_node)                       # [1] and [3] locked, [2] evictable
    running = alloc.alloc(2)                              # slots 4, 5 in use by a request
    written = np.zeros(13, dtype=bool)
    written[[1, 2, 3, 4, 5, 6]] = True                    # 6 held KV once, now free
    states = slot_states(snapshot_cache(cache), written, running.numpy())
    names = [SLOT_STATES[s] for s in states]
    assert names == ["padding", "locked", "evictable", "locked", "in_use", "in_use", "free_stale"] + \
        ["never_written"] * 6


def test_pool_and_engine_views_serialise():
    pool = PoolView(num_layers=2, num_slots=4, page_size=1, states=frozen_array(np.zeros(5, np.int8)),
                    slot_tokens=frozen_array(np.full(5, -1)), k_norms=frozen_array(np.ones((2, 5), np.float32)))
    assert not pool.states.flags.writeable
    with pytest.raises(ValueError):
        pool.states[0] = 1
    cache, _, _ = built()
    req = RequestView(rid="r0", state="finished", prompt_tokens=3, cached_tokens=1, output_tokens=1,
                      prompt_text="a b c", output_text="d", finish_reason="length", ttft=0.1, total_time=0.2)
    eng = EngineSnapshot(seq=cache.events.last_seq, step=1, cache=snapshot_cache(cache), pool=pool,
                         requests=(req,), metrics={"hit_rate": 0.5}, token_text={1: "a"})
    d = json.loads(json.dumps(eng.to_dict()))
    assert d["token_text"] == {"1": "a"} and d["pool"]["k_norms"] == [[1.0] * 5] * 2
    assert d["requests"][0]["rid"] == "r0" and d["cache"]["seq"] == eng.seq


def test_incremental_snapshot_equals_a_full_rebuild_under_random_operations():
    """After every random match / insert / lock / unlock / evict / reset, the incrementally built
    snapshot equals one built from scratch (the memo dropped)."""
    import random

    from core.observe.snapshot import snapshot_cache
    rng = random.Random(0)
    t = [0]
    alloc = SlotAllocator(200)
    cache = RadixCache(alloc, eviction_policy="lru", clock=lambda: t[0])
    locked = []
    for step in range(400):
        t[0] += rng.random() < 0.5
        op = rng.random()
        key = RadixKey([rng.randrange(1, 5) for _ in range(rng.randrange(1, 9))])
        if op < 0.35:
            m = cache.match_prefix(key)
            need = len(key) - m.indices.numel()
            new = alloc.alloc(need) if need else m.indices[:0]
            if new is not None:
                n = cache.insert(key, torch.cat([m.indices, new]))
                alloc.free(torch.cat([m.indices, new])[m.indices.numel():n])
        elif op < 0.45:   # an insert with no match before it: its walk alone stamps the path
            value = alloc.alloc(len(key))
            if value is not None:
                alloc.free(value[:cache.insert(key, value, priority=rng.randrange(3))])
        elif op < 0.5:
            m = cache.match_prefix(key)
            if m.indices.numel():
                cache.inc_lock_ref(m.last_node)
                locked.append(m.last_node)
        elif op < 0.6 and locked:
            cache.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        elif op < 0.75:
            cache.evict(rng.randrange(1, 10))
        elif op < 0.77 and not locked:
            cache.reset()
        else:
            cache.match_prefix(key)
        got = snapshot_cache(cache)
        forget_snapshots(cache)
        fresh = snapshot_cache(cache)
        assert got.to_dict() == fresh.to_dict(), step
        assert tuple(got.eviction_order) == tuple(n.id for n in cache.eviction_order())
        assert snapshot_cache(cache) is fresh            # nothing changed since: the memo's object again


def test_snapshot_with_nothing_changed_is_the_same_object():
    cache, _, _ = built()
    a = snapshot_cache(cache)
    assert snapshot_cache(cache) is a
    cache.match_prefix(RadixKey([1, 2], "tenant"))
    assert snapshot_cache(cache) is not a
