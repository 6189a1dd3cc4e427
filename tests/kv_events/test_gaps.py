"""A dropped batch is found (never skipped silently) and filled from the replay socket; without a
replay socket it stays an unrecovered gap and the tree is marked inexact until AllBlocksCleared.

No sleeps: each test publishes batch 0 before any subscriber exists (so it is lost, always), then
waits for the subscriber's catch-up and for the publisher to hold its subscription, so every later
batch arrives live and the gaps, replays and duplicates are the same on every run."""
from __future__ import annotations

from collections import Counter

import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.kv_events.follower import StreamFollower
from core.kv_events.publisher import KVEventPublisher
from core.kv_events.subscriber import KVEventSubscriber
from core.observe.snapshot import snapshot_cache
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


def _join(pub, *options: dict) -> list:
    """Batch 0 goes out before any SUB exists (lost to all); then one subscriber per `options`
    catches up, and the publisher holds every subscription: each later batch reaches them live."""
    assert pub.flush() == 0
    subs = []
    try:
        for kw in options:
            subs.append(KVEventSubscriber(pub.endpoint, **kw).start())
            subs[-1].catch_up()
        assert pub.wait_for_subscribers(len(subs), 10.0), pub.subscriptions
    except BaseException:
        for sub in subs:
            sub.close()
        raise
    return subs


def _copies(follower) -> Counter:
    return Counter(seq for seq, _ in follower.arrivals)


def _paths(follower) -> list:
    return list(follower.arrivals)


def test_dropped_batch_is_reported_and_recovered_through_replay():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL)
    sub, = _join(pub, {"replay_endpoint": pub.replay_endpoint})
    try:
        _insert(cache, [1, 2, 3, 4, 5, 6, 7, 8])
        _sync(pub, sub)
        pub.drop_next = 1                     # the next batch is buffered for replay but never sent
        _insert(cache, [1, 2, 3, 4, 9, 9, 9, 9])
        assert pub.flush() == 2
        assert sub.follower.last_seq == 1     # nothing arrived: a subscriber cannot know yet
        _insert(cache, [7, 7, 7, 7])
        _sync(pub, sub)                       # seq 3 arrives, seq 2 is missing -> replay
        f = sub.follower
        # batch 0 came by the catch-up; the replay from seq 2 gives back the lost 2 and the held 3
        assert [(g.start, g.end, g.reason, g.recovered, g.replayed) for g in f.gaps] == \
            [(0, 0, "joined late", True, 1), (2, 2, "missing batches", True, 2)]
        assert _paths(f) == [(0, "replay"), (1, "live"), (3, "live"), (2, "replay"), (3, "replay")]
        assert f.status()["exact"] and sub.replays == 2 and sub.errors == []
        assert f.tree.prefixes() == radix_prefixes(snapshot_cache(cache))
        # every batch applied once; batch 3 came live and by replay: its second copy is the one duplicate
        assert f.batches == 4 and f.last_seq == 3
        assert f.duplicates == sum(c - 1 for c in _copies(f).values()) == 1
    finally:
        sub.close()
        pub.close()


def test_gap_without_replay_socket_stays_unrecovered_until_cleared():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL)
    sub, = _join(pub, {})                      # no replay socket: batch 0 is lost for good
    try:
        _insert(cache, [1, 2, 3, 4])
        _sync(pub, sub)
        pub.drop_next = 1
        _insert(cache, [5, 6, 7, 8])
        pub.flush()
        _insert(cache, [5, 6, 7, 8, 1, 1, 1, 1])
        _sync(pub, sub)
        st = sub.follower.status()
        gaps = [(g.start, g.end, g.reason, g.recovered, g.replayed) for g in sub.follower.gaps]
        assert gaps == [(0, 0, "joined late", False, 0), (2, 2, "missing batches", False, 0)]
        assert not st["exact"] and st["suspect_since"] == 0 and st["missing_batches"] == 2
        assert _paths(sub.follower) == [(1, "live"), (3, "live")] and sub.follower.duplicates == 0
        # the child arrived without its parent: an orphan, counted, and the lookup path is broken
        tree = sub.follower.tree
        assert len(tree.orphans) == 1 and tree.stats()["orphans"] == 1
        assert tree.prefixes() != radix_prefixes(snapshot_cache(cache))
        cache.evict(100)
        cache.reset()                          # AllBlocksCleared: exact again
        _insert(cache, [3, 3, 3, 3])
        _sync(pub, sub)
        assert sub.follower.status()["exact"]
        assert tree.prefixes() == radix_prefixes(snapshot_cache(cache))
    finally:
        sub.close()
        pub.close()


def test_late_subscriber_catches_up_from_the_replay_buffer():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL)
    try:
        assert pub.flush() == 0                # AllBlocksCleared of the empty tree
        for i in range(5):
            _insert(cache, [i + 1] * 8)
            assert pub.flush() == i + 1        # 5 batches more that no one heard
        sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
        try:
            gap = sub.catch_up()               # the thread's own catch-up: done once, this call waits for it
            assert (gap.start, gap.end, gap.reason, gap.recovered, gap.replayed) == (0, 5, "joined late", True, 6)
            assert sub.catch_up() is gap and sub.follower.gaps == [gap] and sub.replays == 1
            assert sub.follower.tree.prefixes() == radix_prefixes(snapshot_cache(cache))
            assert pub.wait_for_subscribers(1, 10.0)
            _insert(cache, [9] * 4)
            _sync(pub, sub)
            f = sub.follower
            assert f.tree.prefixes() == radix_prefixes(snapshot_cache(cache))
            assert f.status()["exact"] and f.gaps == [gap] and f.batches == 7 and f.duplicates == 0
            assert _paths(f) == [(s, "replay") for s in range(6)] + [(6, "live")]
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
    assert gap.replayed == 3 and f.batches == 4 and f.duplicates == 1    # the held 3 came back by replay too
    assert f.offer(2, stored(3, 2)) is None and f.duplicates == 2        # a late live copy
    assert f.duplicates == sum(c - 1 for c in _copies(f).values())
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


def test_live_copy_of_a_caught_up_batch_is_a_duplicate_not_a_restart():
    """A SUB connected while its catch-up was served: the live copies of batches 0 and 1 wait in the
    socket behind a replay that already applied 0..2. Seq 0 again is a late copy (same batch time),
    not a restarted publisher: the tree is not cleared and nothing is applied twice."""
    from core.kv_events.protocol import AllBlocksCleared, BlockStored, KVEventBatch, encode_batch
    frames = [encode_batch(KVEventBatch(1.0, [AllBlocksCleared()], 0)),
              encode_batch(KVEventBatch(1.1, [BlockStored([1], None, [1], 1, None, "GPU")], 0)),
              encode_batch(KVEventBatch(1.2, [BlockStored([2], 1, [2], 1, None, "GPU")], 0))]
    f = StreamFollower()
    gap = f.catch_up([(s, p, b"") for s, p in enumerate(frames)])
    assert (gap.start, gap.end, gap.reason, gap.recovered, gap.replayed) == (0, 2, "joined late", True, 3)
    assert f.offer(0, frames[0]) is None and f.offer(1, frames[1]) is None
    assert f.gaps == [gap] and f.tree.clears == 1 and sorted(f.tree.blocks) == [(0, 1), (0, 2)]
    assert f.batches == 3 and f.duplicates == 2 == sum(c - 1 for c in _copies(f).values())
    assert f.offer(3, encode_batch(KVEventBatch(1.3, [BlockStored([3], 2, [3], 1, None, "GPU")], 0))) is None
    assert f.last_seq == 3 and f.status()["exact"] and not f.tree.orphans
    # a catch-up that comes after live frames opened the stream adds no gap: it only fills or repeats
    g = StreamFollower()
    assert g.offer(0, frames[0]) is None and g.catch_up([(0, frames[0], b""), (1, frames[1], b"")]) is None
    assert g.gaps == [] and g.last_seq == 1 and g.batches == 2 and g.duplicates == 1
    assert _paths(g) == [(0, "live"), (0, "replay"), (1, "replay")]
    assert StreamFollower().catch_up([]) is None


def test_topic_filters_and_replay_carries_the_topic():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, topic="kv@rank0")
    mine, other = _join(pub, {"topic": "kv@", "replay_endpoint": pub.replay_endpoint}, {"topic": "metrics"})
    try:
        _insert(cache, [4, 4, 4, 4])
        seq = _sync(pub, mine)
        assert seq == 1 and _paths(mine.follower) == [(0, "replay"), (1, "live")]
        assert mine.follower.tree.prefixes() == radix_prefixes(snapshot_cache(cache))
        # the XPUB filters by topic as it sends: batch 1 was never queued for "metrics" (a later frame
        # would be visible by now, as mine's was)
        assert other.follower.last_seq is None and not other.follower.arrivals and other.errors == []
        frames = mine._replay(0)
        assert [f[0] for f in frames] == list(range(seq + 1)) and {f[2] for f in frames} == {b"kv@rank0"}
    finally:
        other.close()
        mine.close()
        pub.close()


def test_publisher_that_fails_midway_resyncs_instead_of_drifting():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL)
    sub, = _join(pub, {"replay_endpoint": pub.replay_endpoint})
    try:
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
        assert sub.follower.tree.prefixes() == radix_prefixes(snapshot_cache(cache))
        assert sub.follower.status()["exact"] and sub.follower.tree.clears == 2
    finally:
        sub.close()
        pub.close()
