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
from tests.kv_events.helpers import FIX, LOCAL, engine_decoder


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
    """Plain and salted chains, SGLang's default and dynamo formats, vLLM's cache_salt extra key."""
    with open(os.path.join(FIX, "hashes.json")) as fh:
        rows = json.load(fh)
    assert {r["scheme"] for r in rows} == {"sglang", "vllm"}
    assert {(r.get("format"), r["salt"] is not None) for r in rows if r["scheme"] == "sglang"} == \
        {("default", False), ("default", True), ("dynamo", False), ("dynamo", True)}
    for r in rows:
        hasher = BlockHasher(r["page_size"], r["scheme"], r.get("format", "default"))
        _, published = hasher.chain(None, r["tokens"], r["salt"])
        want = r["hashes"] if r["scheme"] == "sglang" else [bytes.fromhex(h) for h in r["hashes_hex"]]
        assert published == want, r


def test_salted_sglang_hashes_start_from_the_cache_salt_seed():
    """SGLang's default format hashes a salted chain from sha256("sglang-cache-salt-v1" 0 salt) and
    publishes the plain int64 of it: not the unsalted hash, not a namespace-mapped one."""
    with open(os.path.join(FIX, "hashes.json")) as fh:
        rows = {(r["format"], r["salt"]): r["hashes"] for r in json.load(fh)
                if r["scheme"] == "sglang" and r["tokens"] == [9] * 8}
    salted, dynamo, plain = rows[("default", "tenant-b")], rows[("dynamo", "tenant-b")], rows[("dynamo", None)]
    assert len({tuple(salted), tuple(dynamo), tuple(plain)}) == 3
    assert BlockHasher(4, "sglang").chain(None, [9] * 8)[1] == plain
    assert BlockHasher(4, "sglang").chain(None, [9] * 8, "tenant-b")[1] == salted
    assert BlockHasher(4, "sglang", "dynamo").chain(None, [9] * 8, "tenant-b")[1] == dynamo


def _parity_events(engine: str, fmt: str, steps: list, page_size: int) -> list:
    """Our publisher, given PARITY's cache changes (scripts/make_kv_event_fixtures.py): the raw
    events of each step's batch."""
    cache = RadixCache(SlotAllocator(64, page_size=page_size), page_size=page_size)
    pub = KVEventPublisher(cache, endpoint=LOCAL, interval=3600, hash_scheme=engine, fmt=fmt)
    out = []
    try:
        assert pub.flush() == 0
        for step in steps:
            if step["op"] == "insert":
                key = RadixKey(step["tokens"], step["salt"])
                m = cache.match_prefix(key)
                cache.insert(key, torch.cat([m.indices, cache.allocator.alloc(len(step["tokens"]) - len(m.indices))]))
            elif step["op"] == "evict":
                cache.evict(page_size)     # the least recently used leaf: [9..12]
            else:
                cache.reset()
            before = pub.last_seq
            assert pub.flush() == before + 1
            # the events exactly as sent: their bytes, not a re-encoding (map header sizes differ)
            out.append(msgspec.msgpack.decode(pub._buffer[-1][1], type=tuple[float, msgspec.Raw, int]))
    finally:
        pub.close()
    return out


@pytest.mark.parametrize("name", ["sglang-default", "sglang-dynamo", "vllm"])
def test_our_publisher_sends_what_the_engine_sends_for_the_same_cache_changes(name):
    """Plain and salted inserts, a child under each, an eviction, a flush: each step's events are the
    bytes SGLang's recorder (default and dynamo format) or vLLM's block pool queue for the same
    changes, cache_salt field, vLLM's lora_name / extra_keys / group_idx and all."""
    with open(os.path.join(FIX, "parity.json")) as fh:
        doc = json.load(fh)[name]
    engine, fmt = (name.split("-") + ["default"])[:2]
    ours = _parity_events(engine, fmt, doc["steps"], doc["page_size"])
    for step, batch in zip(doc["steps"], ours):
        assert bytes(batch[1]).hex() == step["events_hex"], (step["op"], step["salt"], msgspec.msgpack.decode(batch[1]))
        assert batch[2] == 0          # the dp rank, third in the array


def _stream(engine: str) -> list:
    """Payloads our publisher sends for a small workload: salted and plain chains, evictions, a reset."""
    cache = RadixCache(SlotAllocator(32, page_size=4), page_size=4)
    pub = KVEventPublisher(cache, endpoint=LOCAL, replay_endpoint=LOCAL, hash_scheme=engine, interval=3600)
    try:
        pub.flush()
        for ids, salt in (([1] * 12, None), ([1] * 8 + [2] * 4, None), ([1] * 8, "tenant-b"), ([3] * 16, "t2")):
            key = RadixKey(ids, salt)
            m = cache.match_prefix(key)
            if cache.allocator.available() < len(ids) - len(m.indices):
                cache.evict(len(ids) - len(m.indices) - cache.allocator.available())
            cache.insert(key, torch.cat([m.indices, cache.allocator.alloc(len(ids) - len(m.indices))]))
            pub.flush()
        cache.evict(8)
        pub.flush()
        cache.reset()
        pub.flush()
        return [payload for _, payload in pub._buffer]
    finally:
        pub.close()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_each_engines_own_decoder_reads_our_stream_in_its_format(engine):
    decoder = engine_decoder(engine)
    payloads = _stream(engine)
    kinds = [type(e).__name__ for p in payloads for e in decoder.decode(p).events]
    assert {"BlockStored", "BlockRemoved", "AllBlocksCleared"} <= set(kinds), kinds
    if engine == "vllm":
        stored = [e for p in payloads for e in decoder.decode(p).events if type(e).__name__ == "BlockStored"]
        assert all(e.lora_name is None and e.group_idx == 0 and len(e.extra_keys) == len(e.block_hashes)
                   for e in stored)
        assert [e.extra_keys[0] for e in stored if e.parent_block_hash is None] == [None, ("tenant-b",), ("t2",)]
    else:
        salts = [e.cache_salt for p in payloads for e in decoder.decode(p).events if type(e).__name__ == "BlockStored"]
        assert salts.count("tenant-b") == 1 and salts.count("t2") == 1
    # the rebuilt decoders are the engines' strict ones: neither reads the other's stream
    other = engine_decoder("sglang" if engine == "vllm" else "vllm")
    with pytest.raises(msgspec.ValidationError):
        for p in payloads:
            other.decode(p)


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
