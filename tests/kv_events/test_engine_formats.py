"""Batches made by SGLang's and vLLM's own code decode into the block tree that produced them.

The fixtures were written by scripts/make_kv_event_fixtures.py from the sglang 0.5.23 and
vllm 0.33.0 wheels: their KVCacheEventRecorder / event classes built the batches, their
ZmqEventPublisher sent them on 127.0.0.1 and their replay ROUTER answered our catch-up; the
frames are stored as received. The expected trees come from the same scenarios' bookkeeping.
"""
from __future__ import annotations

import json
import os

import msgspec
import pytest
import torch

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.kv_events.follower import StreamFollower
from core.kv_events.hashing import BlockHasher
from core.kv_events.protocol import BlockStored, SGLangKVEventBatch, decode_batch, encode_batch
from core.kv_events.publisher import KVEventPublisher
from core.kv_events.recorder import read_recording
from core.kv_events.subscriber import KVEventSubscriber
from tests.kv_events.helpers import LOCAL

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


def _hash(x):
    return bytes.fromhex(x["bytes"]) if isinstance(x, dict) else x


def _rows(tree) -> list:
    rows = [[k[1], None if b.parent is None else b.parent[1], list(b.tokens), sorted(b.media)]
            for k, b in tree.blocks.items()]
    return sorted(rows, key=lambda r: (isinstance(r[0], int), r[0]))


def _expected(engine: str) -> list:
    with open(os.path.join(FIX, f"{engine}_expected.json")) as f:
        states = json.load(f)["states"]
    return [(s["note"], sorted(([_hash(r[0]), _hash(r[1]), r[2], r[3]] for r in s["blocks"]),
                               key=lambda r: (isinstance(r[0], int), r[0]))) for s in states]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_engine_batches_rebuild_the_engine_tree_after_every_batch(engine):
    frames = list(read_recording(os.path.join(FIX, f"{engine}_live.bin")))
    expected = _expected(engine)
    assert [f.seq for f in frames] == list(range(len(expected))) and all(f.topic == b"" for f in frames)
    follower = StreamFollower()
    for fr, (note, rows) in zip(frames, expected):
        assert follower.offer(fr.seq, fr.payload, fr.topic) is None
        assert _rows(follower.tree) == rows, note
    assert follower.status()["exact"] and follower.gaps == [] and follower.tree.unknown_removals == 0
    # what the engine's replay ROUTER sent our catch-up is the same stream, byte for byte
    replayed = [(f.seq, f.payload) for f in read_recording(os.path.join(FIX, f"{engine}_replay.bin"))]
    assert replayed == [(f.seq, f.payload) for f in frames]


def test_sglang_specifics_tiers_orphans_and_bytes():
    frames = list(read_recording(os.path.join(FIX, "sglang_live.bin")))
    sglang_shape = msgspec.msgpack.Decoder(SGLangKVEventBatch)
    for fr in frames:   # the structs we publish with re-encode SGLang's batches to the very same bytes
        assert encode_batch(sglang_shape.decode(fr.payload)) == fr.payload
    f = StreamFollower()
    for fr in frames[:4]:
        f.offer(fr.seq, fr.payload)
    assert f.tree.media_counts() == {"CPU": 1, "GPU": 8}    # HiCache's CPU_PINNED is the CPU tier
    assert decode_batch(frames[0].payload).dp_rank == 0


def test_vllm_specifics_bytes_hashes_reuse_and_evicted_parent():
    frames = list(read_recording(os.path.join(FIX, "vllm_live.bin")))
    f = StreamFollower()
    for fr in frames[:2]:
        f.offer(fr.seq, fr.payload)
    assert all(isinstance(k[1], bytes) and len(k[1]) == 32 for k in f.tree.blocks)
    assert sum(b.restores for b in f.tree.blocks.values()) == 1   # the reused prefix, re-announced
    for fr in frames[2:4]:
        f.offer(fr.seq, fr.payload)
    assert len(f.tree.orphans) == 2    # vLLM freed a parent before its children: they are unreachable
    assert f.tree.stats()["orphans"] == 2
    f.offer(frames[4].seq, frames[4].payload)
    assert all(isinstance(k[1], int) for k in f.tree.blocks) and f.tree.clears == 1
    raw = msgspec.msgpack.decode(frames[0].payload)
    assert raw[2] == 0 and raw[1][0]["type"] == "BlockStored"   # [ts, events, data_parallel_rank]


def test_our_hashes_are_the_engines_hashes():
    with open(os.path.join(FIX, "hashes.json")) as fh:
        rows = json.load(fh)
    assert {r["scheme"] for r in rows} == {"sglang", "vllm"}
    for r in rows:
        _, published = BlockHasher(r["page_size"], r["scheme"]).chain(None, r["tokens"], r["extra_key"])
        want = r["hashes"] if r["scheme"] == "sglang" else [bytes.fromhex(h) for h in r["hashes_hex"]]
        assert published == want, r


def test_our_publisher_sends_what_sglang_sends_for_the_same_tree():
    """The first SGLang batch stores [1..8] then [9..12] under it (page 4): our publisher, given the
    same inserts, emits the same BlockStored bytes (after the AllBlocksCleared it starts with)."""
    sglang_events = decode_batch(next(iter(read_recording(os.path.join(FIX, "sglang_live.bin")))).payload).events
    cache = RadixCache(SlotAllocator(64, page_size=4), page_size=4)
    # interval: publish only on flush(), so both inserts land in one batch as in SGLang's step
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, interval=3600)
    assert pub.flush() == 0   # AllBlocksCleared, before the SUB exists: the catch-up brings it
    sub = KVEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint).start()
    try:
        assert sub.catch_up().end == 0 and pub.wait_for_subscribers(1, 10.0)
        cache.insert(RadixKey(list(range(1, 9))), cache.allocator.alloc(8))
        m = cache.match_prefix(RadixKey(list(range(1, 13))))
        cache.insert(RadixKey(list(range(1, 13))), torch.cat([m.indices, cache.allocator.alloc(4)]))
        seq = pub.flush()
        assert seq == 1 and sub.follower.wait_for(seq, 5.0) and sub.follower.status()["exact"]
        assert list(sub.follower.arrivals) == [(0, "replay"), (1, "live")]   # both inserts: one batch
        ours = decode_batch(pub._buffer[-1][1]).events
        assert all(isinstance(e, BlockStored) for e in ours)
        assert [msgspec.msgpack.encode(e) for e in ours] == [msgspec.msgpack.encode(e) for e in sglang_events]
    finally:
        sub.close()
        pub.close()
