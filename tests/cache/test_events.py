"""EventLog (bounded ring, since(seq), monotonic seq) and the events the cache emits."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from core.cache import events as ev
from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.observe.snapshot import snapshot_cache


def test_ring_is_bounded_and_seq_keeps_counting():
    log = ev.EventLog(capacity=3)
    for i in range(5):
        e = log.append(ev.AllocEvent, time=i, slots=(i,))
        assert e.seq == i + 1
    assert len(log) == 3 and log.last_seq == 5
    assert [e.seq for e in log] == [3, 4, 5]
    assert [e.slots for e in log] == [(2,), (3,), (4,)]


def test_since_returns_what_came_after_a_seq():
    log = ev.EventLog(capacity=3)
    assert log.since(0) == []
    for i in range(5):
        log.append(ev.FreeEvent, time=0, slots=(i,))
    assert [e.seq for e in log.since(0)] == [3, 4, 5]     # 1 and 2 fell off the ring
    assert [e.seq for e in log.since(2)] == [3, 4, 5]
    assert [e.seq for e in log.since(3)] == [4, 5]
    assert [e.seq for e in log.since(4)] == [5]
    assert log.since(5) == [] and log.since(99) == []
    assert [e.seq for e in log.since(-7)] == [3, 4, 5]


def test_seq_strictly_increasing_across_many_wraps():
    log = ev.EventLog(capacity=7)
    seen = []
    last = 0
    for i in range(100):
        log.append(ev.ResetEvent, time=i)
        new = log.since(last)
        assert len(new) == 1
        seen.extend(e.seq for e in new)
        last = new[-1].seq
    assert seen == list(range(1, 101))
    assert [e.seq for e in log] == list(range(94, 101))


def test_disabled_log_records_nothing():
    log = ev.EventLog(capacity=3, enabled=False)
    assert log.append(ev.ResetEvent, time=0) is None
    assert len(log) == 0 and log.last_seq == 0 and log.since(0) == []


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        ev.EventLog(capacity=0)


def test_events_are_frozen_typed_and_json_serialisable():
    e = ev.EvictEvent(seq=1, time=3, node=3, parent=2, token_ids=(6, 7), slots=(6, 7),
                      last_access_time=1, policy_key=(1.0,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.node = 4
    d = e.to_dict()
    assert d["kind"] == "evict" and d["slots"] == (6, 7)
    assert json.loads(json.dumps(d))["policy_key"] == [1.0]
    assert set(ev.EVENT_TYPES) == {"match", "split", "insert", "alloc", "free", "evict", "lock", "unlock", "touch", "reset"}
    assert all(cls.kind == k for k, cls in ev.EVENT_TYPES.items())


# ----- what the cache emits -------------------------------------------------------------------------------
def test_cache_events_carry_time_and_every_mutation_is_logged():
    t = [7]
    alloc = SlotAllocator(8)
    cache = RadixCache(alloc, clock=lambda: t[0])
    assert [e.kind for e in cache.events] == ["reset"]
    v = alloc.alloc(3)
    cache.insert(RadixKey([1, 2, 3], "x"), v)
    t[0] = 8
    m = cache.match_prefix(RadixKey([1, 2, 9], "x"))
    cache.inc_lock_ref(m.last_node)
    cache.dec_lock_ref(m.last_node)
    cache.evict(8)
    got = [(e.kind, e.time) for e in cache.events.since(1)]
    assert got == [("alloc", 7), ("insert", 7), ("split", 8), ("match", 8), ("lock", 8), ("unlock", 8),
                   ("evict", 8), ("free", 8), ("evict", 8), ("free", 8)]
    match = [e for e in cache.events if e.kind == "match"][0]
    assert (match.tokens_asked, match.tokens_hit, match.extra_key) == (3, 2, "x")
    evicts = [e for e in cache.events if e.kind == "evict"]
    assert [e.slots for e in evicts] == [(3,), (1, 2)]       # the leaf, then its parent
    assert [e.token_ids for e in evicts] == [(3,), (1, 2)]
    frees = [e for e in cache.events if e.kind == "free"]
    assert [e.slots for e in frees] == [(3,), (1, 2)]
    seqs = [e.seq for e in cache.events]
    assert seqs == list(range(1, len(seqs) + 1))


def test_cache_event_ring_and_record_events_false():
    alloc = SlotAllocator(64)
    cache = RadixCache(alloc, event_capacity=4)
    for i in range(10):
        cache.insert(RadixKey([i, i]), alloc.alloc(2))
    assert len(cache.events) == 4 and cache.events.last_seq == 21      # reset + 10 x (alloc, insert)
    quiet = RadixCache(SlotAllocator(8), record_events=False)
    quiet.insert(RadixKey([1]), quiet.allocator.alloc(1))
    quiet.match_prefix(RadixKey([1, 2]))
    quiet.evict(1)
    assert len(quiet.events) == 0 and quiet.events.last_seq == 0
    assert quiet.allocator.available() == 8


def test_dashboard_polling_sees_each_event_once():
    alloc = SlotAllocator(16)
    cache = RadixCache(alloc)
    last = snapshot_cache(cache).seq
    kinds = []
    for toks in ([1, 2, 3], [1, 2, 4], [5]):
        key = RadixKey(toks)
        m = cache.match_prefix(key)
        cache.inc_lock_ref(m.last_node)
        new = alloc.alloc(len(toks) - m.indices.numel())
        cache.insert(key, torch.cat([m.indices, new]))
        cache.dec_lock_ref(m.last_node)
        new_events = cache.events.since(last)
        kinds.append([e.kind for e in new_events])
        last = new_events[-1].seq
        assert last == snapshot_cache(cache).seq
    assert kinds == [["match", "alloc", "insert"],
                     ["split", "match", "lock", "alloc", "insert", "unlock"],
                     ["match", "alloc", "insert"]]


# ----- issue 10, item 10: bounded in bytes, O(new) reads, every touch recorded -----------------------------
def test_log_is_bounded_in_bytes_not_only_in_count():
    log = ev.EventLog(capacity=100_000, budget_bytes=2_000_000)
    big = tuple(range(1000, 3000))                     # a 2,000-token insert
    for i in range(500):
        log.append(ev.InsertEvent, time=i, node=i, parent=0, token_ids=big, slots=big)
    assert log.nbytes <= 2_000_000 and len(log) == 2_000_000 // ev.event_bytes(log.since(499)[0])
    assert log.nbytes == len(log) * ev.event_bytes(log.since(499)[0])
    assert [e.seq for e in log.since(0)] == list(range(501 - len(log), 501))   # the newest survive, in order
    log.append(ev.ResetEvent, time=0)
    assert log.since(500)[0].kind == "reset" and log.last_seq == 501


def test_engine_default_event_budget_is_well_under_100_mb():
    from core.engine.config import EngineConfig
    assert EngineConfig().event_budget_bytes <= 32 * 2**20


def test_since_costs_what_it_returns():
    import time
    log = ev.EventLog(capacity=100_000)
    for i in range(100_000):
        log.append(ev.FreeEvent, time=0, slots=(i,))

    def best(fn, n=5):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return min(out)

    assert [e.seq for e in log.since(99_990)] == list(range(99_991, 100_001))
    assert [e.seq for e in log.since(99_990, limit=3)] == [99_991, 99_992, 99_993]
    recent, everything = best(lambda: log.since(99_990)), best(lambda: log.since(0))
    assert recent * 50 < everything      # 10 events vs 100,000: no copy of the whole log


def test_an_insert_that_adds_nothing_records_its_touch():
    t = [1]
    alloc = SlotAllocator(8)
    cache = RadixCache(alloc, clock=lambda: t[0])
    cache.insert(RadixKey([1, 2, 3]), alloc.alloc(3))
    t[0] = 5
    seq = cache.events.last_seq
    dup = alloc.alloc(2)
    assert cache.insert(RadixKey([1, 2]), dup) == 2          # nothing new: a split and a touch
    touch = [e for e in cache.events.since(seq) if e.kind == "touch"]
    assert len(touch) == 1 and touch[0].time == 5
    node = snapshot_cache(cache).node(touch[0].node)
    assert node.token_ids == (1, 2) and node.last_access_time == 5 and touch[0].path == (node.id,)
    alloc.free(dup)
