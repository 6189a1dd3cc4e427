"""A dropped batch is found (never skipped silently) and filled from the replay socket; without a
replay socket it stays an unrecovered gap and the tree is marked inexact until AllBlocksCleared."""
from __future__ import annotations

import time

import torch

from core.kv_events.follower import StreamFollower
from core.kv_events.publisher import KVEventPublisher
from core.kv_events.subscriber import KVEventSubscriber
from core.memory import SlotAllocator
from core.radix_cache import RadixCache, RadixKey
from tests.kv_events.helpers import LOCAL, radix_prefixes


def _cache(page_size: int = 4) -> RadixCache:
    return RadixCache(SlotAllocator(64, page_size=page_size), page_size=page_size)


def _insert(cache: RadixCache, ids: list) -> None:
    m = cache.match_prefix(RadixKey(ids))
    hit = len(m.indices)
    new = cache.allocator.alloc(len(ids) - hit)
    cache.insert(RadixKey(ids), torch.cat([m.indices, new]))


def _sync(pub, sub) -> int:
    seq = pub.flush()
    assert sub.follower.wait_for(seq, 5.0), sub.follower.status()
    return seq


def test_dropped_batch_is_reported_and_recovered_through_replay():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL)
    sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
    try:
        time.sleep(0.3)   # let the SUB connect before the first batch (ZMQ drops what no one hears)
        _insert(cache, [1, 2, 3, 4, 5, 6, 7, 8])
        _sync(pub, sub)
        pub.drop_next = 1                     # the next batch is buffered for replay but never sent
        _insert(cache, [1, 2, 3, 4, 9, 9, 9, 9])
        assert pub.flush() == 2
        assert sub.follower.last_seq == 1     # nothing arrived: a subscriber cannot know yet
        _insert(cache, [7, 7, 7, 7])
        _sync(pub, sub)                       # seq 3 arrives, seq 2 is missing -> replay
        # (batch 0 may have gone out before the SUB connected: then a "joined late" gap, also filled)
        gaps = [g for g in sub.follower.gaps if g.reason == "missing batches"]
        # the replay gives back everything from seq 2: the lost 2 and the held 3
        assert [(g.start, g.end, g.reason, g.recovered, g.replayed) for g in gaps] == \
            [(2, 2, "missing batches", True, 2)]
        assert all(g.recovered for g in sub.follower.gaps)
        assert sub.follower.status()["exact"] and sub.replays >= 1
        assert sub.follower.tree.prefixes() == radix_prefixes(cache.snapshot())
        assert sub.follower.batches == 4 and sub.follower.duplicates == 0
    finally:
        sub.close()
        pub.close()


def test_gap_without_replay_socket_stays_unrecovered_until_cleared():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL)
    sub = KVEventSubscriber(pub.endpoint).start()
    try:
        time.sleep(0.3)
        _insert(cache, [1, 2, 3, 4])
        _sync(pub, sub)
        pub.drop_next = 1
        _insert(cache, [5, 6, 7, 8])
        pub.flush()
        _insert(cache, [5, 6, 7, 8, 1, 1, 1, 1])
        _sync(pub, sub)
        st = sub.follower.status()
        gaps = [(g.start, g.end, g.recovered) for g in sub.follower.gaps if g.reason == "missing batches"]
        assert gaps == [(2, 2, False)] and not st["exact"]
        # batch 0 (sent as the publisher started) may have beaten the SUB's connection: "joined late"
        assert {g.reason for g in sub.follower.gaps} <= {"missing batches", "joined late"}
        # the child arrived without its parent: an orphan, counted, and the lookup path is broken
        tree = sub.follower.tree
        assert len(tree.orphans) == 1 and tree.stats()["orphans"] == 1
        assert tree.prefixes() != radix_prefixes(cache.snapshot())
        cache.evict(100)
        cache.reset()                          # AllBlocksCleared: exact again
        _insert(cache, [3, 3, 3, 3])
        _sync(pub, sub)
        assert sub.follower.status()["exact"]
        assert tree.prefixes() == radix_prefixes(cache.snapshot())
    finally:
        sub.close()
        pub.close()


def test_late_subscriber_catches_up_from_the_replay_buffer():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL)
    try:
        for i in range(5):
            _insert(cache, [i + 1] * 8)
            pub.flush()                        # 5 batches no one heard
        sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
        try:
            gap = sub.catch_up()
            assert (gap.start, gap.end, gap.recovered) == (0, 4, True)
            assert sub.follower.tree.prefixes() == radix_prefixes(cache.snapshot())
            time.sleep(0.2)
            _insert(cache, [9] * 4)
            _sync(pub, sub)
            assert sub.follower.tree.prefixes() == radix_prefixes(cache.snapshot())
            assert sub.follower.status()["exact"]
        finally:
            sub.close()
    finally:
        pub.close()


def test_follower_orders_replays_ignores_duplicates_and_sees_restarts():
    from core.kv_events.protocol import AllBlocksCleared, BlockStored, KVEventBatch, encode_batch
    def stored(h, parent):
        return encode_batch(KVEventBatch(1.0, [BlockStored([h], parent, [h], 1, None, "GPU")], 0))
    f = StreamFollower()
    assert f.offer(0, stored(1, None)) is None
    gap = f.offer(3, stored(4, 3))
    assert (gap.start, gap.end, gap.reason) == (1, 2, "missing batches")
    f.resolve(gap, [(2, stored(3, 2), b""), (1, stored(2, 1), b""), (3, stored(4, 3), b"")])
    assert gap.recovered and f.last_seq == 3 and not f.tree.orphans and len(f.tree.blocks) == 4
    assert f.offer(2, stored(3, 2)) is None and f.duplicates == 1
    assert f.offer(4, b"\x93garbage") is None    # undecodable: recorded as a gap, tree inexact
    assert f.gaps[-1].reason.startswith("undecodable batch") and not f.status()["exact"]
    assert f.offer(0, encode_batch(KVEventBatch(2.0, [AllBlocksCleared()], 0))) is None
    assert f.gaps[-1].reason == "publisher restarted" and not f.tree.blocks and f.status()["exact"]
    # a restart whose seq 0 was lost: seq 1 with a newer batch time is not taken for a duplicate
    def at(ts, h):
        return encode_batch(KVEventBatch(ts, [BlockStored([h], None, [h], 1, None, "GPU")], 0))
    g = StreamFollower()
    for seq in range(3):
        assert g.offer(seq, at(float(seq), seq + 1)) is None
    assert g.offer(1, at(1.0, 2)) is None and g.duplicates == 1          # a late copy: ignored
    gap = g.offer(1, at(10.0, 7))                                          # a new publisher, seq 0 lost
    assert g.gaps[0].reason == "publisher restarted" and (gap.start, gap.end, gap.reason) == (0, 0, "joined late")
    g.resolve(gap, [])
    assert list(g.tree.blocks) == [(0, 7)] and not g.status()["exact"] and g.last_seq == 1


def test_topic_filters_and_replay_carries_the_topic():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, topic="kv@rank0")
    mine = KVEventSubscriber(pub.endpoint, topic="kv@", replay_endpoint=pub.replay_endpoint).start()
    other = KVEventSubscriber(pub.endpoint, topic="metrics").start()
    try:
        time.sleep(0.3)
        _insert(cache, [4, 4, 4, 4])
        seq = _sync(pub, mine)
        assert mine.follower.tree.prefixes() == radix_prefixes(cache.snapshot())
        time.sleep(0.2)
        assert other.follower.last_seq is None and other.follower.batches == 0
        frames = mine._replay(0)
        assert [f[0] for f in frames] == list(range(seq + 1)) and {f[2] for f in frames} == {b"kv@rank0"}
    finally:
        other.close()
        mine.close()
        pub.close()


def test_publisher_that_fails_midway_resyncs_instead_of_drifting():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL)
    sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
    try:
        time.sleep(0.3)
        _insert(cache, [1, 1, 1, 1])
        _sync(pub, sub)
        real, calls = pub.hasher.chain, []
        def broken(*a, **k):   # the hasher fails once, in the middle of a slice of events
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("boom")
            return real(*a, **k)
        pub.hasher.chain = broken
        _insert(cache, [2, 2, 2, 2])
        _insert(cache, [3, 3, 3, 3])
        pub.flush()
        assert pub.errors == ["RuntimeError: boom"]
        _sync(pub, sub)            # the next round resyncs: AllBlocksCleared + the whole tree
        assert sub.follower.tree.prefixes() == radix_prefixes(cache.snapshot())
        assert sub.follower.status()["exact"] and sub.follower.tree.clears == 2
    finally:
        sub.close()
        pub.close()
