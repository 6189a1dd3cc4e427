"""A subscriber that joins (or falls) further back than the replay buffer reaches: it applies what
the buffer still holds, logs one gap for what is truly lost, counts it once, and never asks for
the same seqs twice; a recording keeps the gaps its recorder saw, so `show` lists them.

The publisher is ours, with SGLang's / vLLM's ZmqEventPublisher semantics (seq from 0, a replay
buffer of the last `buffer_steps` batches, replay = every buffered batch from the asked seq on)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.kv_events.follower import StreamFollower
from core.kv_events.protocol import BlockStored, KVEventBatch, encode_batch
from core.kv_events.publisher import KVEventPublisher
from core.kv_events.recorder import Recorder, read_recording, replay_recording
from core.kv_events.subscriber import KVEventSubscriber
from tests.kv_events.helpers import FIX, LOCAL

PS = 4


def _cache() -> RadixCache:
    return RadixCache(SlotAllocator(256, page_size=PS), page_size=PS)


def _batch(pub: KVEventPublisher, cache: RadixCache, n: int) -> int:
    """One batch storing one new block under the root (tokens n, n, n, n)."""
    cache.insert(RadixKey([n] * PS), cache.allocator.alloc(PS))
    return pub.flush()


def _gaps(follower) -> list:
    return [(g.start, g.end, g.reason, g.recovered, g.replayed) for g in follower.gaps]


def test_late_joiner_applies_the_buffer_and_logs_one_gap_for_what_is_lost():
    """Buffer of 5, 20 batches before joining and 3 after: 8 blocks held, one gap, 15 missing."""
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, buffer_steps=5, interval=3600)
    try:
        assert pub.flush() == 0                          # AllBlocksCleared of the empty tree
        for n in range(1, 20):
            assert _batch(pub, cache, n) == n            # batches 1..19: one block each, heard by no one
        sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
        try:
            gap = sub.catch_up()                         # the buffer holds 15..19
            assert pub.wait_for_subscribers(1, 10.0)
            for n in range(20, 23):
                assert sub.follower.wait_for(_batch(pub, cache, n), 5.0)
            f = sub.follower
            st = f.status()
            assert _gaps(f) == [(0, 14, "joined late", False, 5)] and f.gaps == [gap]
            assert (st["gaps"], st["unrecovered_gaps"], st["missing_batches"]) == (1, 1, 15)
            assert len(f.tree.blocks) == 8 and f.batches == 8 and f.last_seq == 22
            assert sorted(b.tokens for b in f.tree.blocks.values()) == [(n,) * PS for n in range(15, 23)]
            assert sub.replays == 1 and f.duplicates == 0 and sub.errors == []   # asked once, from seq 0
            assert list(f.arrivals) == [(s, "replay") for s in range(15, 20)] + [(s, "live") for s in (20, 21, 22)]
            assert not st["exact"] and st["suspect_since"] == 0
        finally:
            sub.close()
    finally:
        pub.close()


def test_mid_stream_loss_beyond_the_buffer_is_one_gap_counted_once():
    cache = _cache()
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, buffer_steps=5, interval=3600)
    try:
        assert pub.flush() == 0
        sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
        try:
            assert sub.catch_up().end == 0 and pub.wait_for_subscribers(1, 10.0)
            assert sub.follower.wait_for(_batch(pub, cache, 1), 5.0)
            pub.drop_next = 8                            # batches 2..9 are buffered, never sent
            for n in range(2, 10):
                assert _batch(pub, cache, n) == n
            assert sub.follower.wait_for(_batch(pub, cache, 10), 5.0)   # 10 arrives: 2..9 are missing
            assert sub.follower.wait_for(_batch(pub, cache, 11), 5.0)
            f = sub.follower
            # the replay from seq 2 gives back 6..10 (10 held too): 2..5 lost, logged once
            assert _gaps(f) == [(0, 0, "joined late", True, 1), (2, 5, "missing batches", False, 5)]
            st = f.status()
            assert (st["gaps"], st["unrecovered_gaps"], st["missing_batches"]) == (2, 1, 4)
            assert sorted(b.tokens[0] for b in f.tree.blocks.values()) == [1, 6, 7, 8, 9, 10, 11]
            assert sub.replays == 2 and f.batches == 8 and f.duplicates == 1   # batch 10: live and replayed
            assert f.duplicates == sum(c - 1 for c in _copies(f).values())
        finally:
            sub.close()
    finally:
        pub.close()


def _copies(follower):
    from collections import Counter
    return Counter(seq for seq, _ in follower.arrivals)


def _stored(n: int, ts: float) -> bytes:
    return encode_batch(KVEventBatch(ts, [BlockStored([n], None, [n], 1, None, "GPU")], 0))


def test_slow_joiner_frame_filled_by_replay_extends_the_join_gap():
    """The catch-up applied 15..19; live 20 never reached the SUB (its subscription was still on the
    way), so 21 opens a hole that the replay fills: that is still joining, not a second gap."""
    f = StreamFollower()
    frames = {s: _stored(s, float(s)) for s in range(15, 23)}
    gap = f.catch_up([(s, frames[s], b"") for s in range(15, 20)])
    assert _gaps(f) == [(0, 14, "joined late", False, 5)]
    hole = f.offer(21, frames[21])
    f.resolve(hole, [(s, frames[s], b"") for s in (20, 21)])
    assert f.gaps == [gap] and _gaps(f) == [(0, 14, "joined late", False, 7)]
    assert f.last_seq == 21 and f.status()["missing_batches"] == 15 and f.duplicates == 1
    # after the first live frame a hole is a loss like any other
    hole = f.offer(23, _stored(23, 23.0))
    f.resolve(hole, [])
    assert _gaps(f)[1:] == [(22, 22, "missing batches", False, 0)] and f.status()["missing_batches"] == 16


def test_truncated_replay_loses_only_the_seqs_it_lacks():
    """A replay that stops short (a timeout) leaves two holes: each is a gap, the held frame applies."""
    f = StreamFollower()
    for s in range(3):
        assert f.offer(s, _stored(s, float(s))) is None
    gap = f.offer(10, _stored(10, 10.0))
    f.resolve(gap, [(s, _stored(s, float(s)), b"") for s in (5, 6)])
    assert _gaps(f) == [(3, 4, "missing batches", False, 2), (7, 9, "missing batches", False, 0)]
    assert f.last_seq == 10 and f.status()["missing_batches"] == 5 and f.batches == 6


def test_recording_keeps_the_gaps_its_recorder_saw(tmp_path):
    """`record --replay` joining late: `show` lists the join gap, filled or not, once."""
    for buffer_steps, want, blocks in ((100, [(0, 5, "joined late", True, 6, 0)], 7),
                                       (3, [(0, 2, "joined late", False, 3, 3)], 5)):   # blocks 1, 2 lost
        cache = _cache()
        pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, buffer_steps=buffer_steps,
                               interval=3600)
        out = tmp_path / f"ev{buffer_steps}.bin"
        try:
            pub.flush()
            for n in range(1, 6):
                _batch(pub, cache, n)
            proc = subprocess.Popen([sys.executable, "-m", "core.kv_events", "record", "--endpoint", pub.endpoint,
                                     "--replay", pub.replay_endpoint, "--out", str(out), "--max-batches",
                                     str(min(buffer_steps, 6) + 2), "--duration", "60"],
                                    stderr=subprocess.PIPE, text=True)
            try:
                assert pub.wait_for_subscribers(1, 30.0)
                deadline = time.monotonic() + 30
                while len(list(read_recording(out))) < min(buffer_steps, 6) and time.monotonic() < deadline:
                    time.sleep(0.05)
                _batch(pub, cache, 6)
                _batch(pub, cache, 7)
                _, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            assert proc.returncode == 0, err
        finally:
            pub.close()
        lost = want[0][5]
        assert f"gaps 1 ({int(lost > 0)} unrecovered, {lost} batches missing)" in err, err
        shown = subprocess.run([sys.executable, "-m", "core.kv_events", "show", str(out)], capture_output=True,
                               text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert [(g["start"], g["end"], g["reason"], g["recovered"], g["replayed"], g["lost"])
                for g in doc["gaps"]] == want
        assert doc["stream"]["missing_batches"] == lost and doc["tree"]["blocks"] == blocks
        f = replay_recording(out)
        assert len(f.gaps) == 1 and f.status()["missing_batches"] == lost


def test_a_recording_without_gap_records_still_shows_its_holes(tmp_path):
    path = tmp_path / "old.bin"
    with Recorder(path) as rec:
        for s in (4, 5, 8):
            rec.write(s, b"", _stored(s, float(s)), float(s))
    f = replay_recording(path)
    assert _gaps(f) == [(0, 3, "joined late", False, 0), (6, 7, "missing batches", False, 0)]
    assert f.status()["missing_batches"] == 6


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_late_join_on_the_engines_own_publisher(engine):
    """Frames from SGLang's / vLLM's ZmqEventPublisher (buffer_steps 5): 20 batches of one block each,
    then the replay ROUTER's answer to a catch-up from seq 0 (15..19 only), then 3 live batches."""
    live = [(f.seq, f.payload, f.topic) for f in read_recording(os.path.join(FIX, f"{engine}_buffer5_live.bin"))]
    replay = [(f.seq, f.payload, f.topic) for f in read_recording(os.path.join(FIX, f"{engine}_buffer5_replay.bin"))]
    assert [f[0] for f in live] == list(range(23)) and [f[0] for f in replay] == list(range(15, 20))
    f = StreamFollower()
    f.catch_up(replay)
    for frame in live[20:]:
        assert f.offer(*frame) is None
    st = f.status()
    assert _gaps(f) == [(0, 14, "joined late", False, 5)]
    assert (len(f.tree.blocks), st["gaps"], st["missing_batches"], f.batches) == (8, 1, 15, 8)
    # mid-stream: 3..17 never arrive; the replay asked from 3 holds 15..19: 3..14 are lost, once
    g = StreamFollower()
    for frame in live[:3]:
        assert g.offer(*frame) is None
    gap = g.offer(*live[18])
    g.resolve(gap, replay)
    for frame in live[19:]:
        assert g.offer(*frame) is None
    assert _gaps(g) == [(3, 14, "missing batches", False, 5)] and g.status()["missing_batches"] == 12
    assert len(g.tree.blocks) == 3 + 8 and g.duplicates == 2     # 18 (held) and 19 (live) came back by replay


def test_held_frame_missing_from_a_replay_that_goes_past_it_is_still_applied():
    f = StreamFollower()
    assert f.offer(0, _stored(0, 0.0)) is None
    gap = f.offer(4, _stored(4, 4.0))                  # 1..3 missing
    f.resolve(gap, [(s, _stored(s, float(s)), b"") for s in (2, 3, 5, 6)])   # the buffer starts at 2, and 4 is not in it
    assert _gaps(f) == [(1, 1, "missing batches", False, 4)]
    assert f.last_seq == 6 and sorted(k[1] for k in f.tree.blocks) == [0, 2, 3, 4, 5, 6] and f.duplicates == 0
