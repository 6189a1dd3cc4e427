"""Shared by the KV event tests: the engine's radix tree at page granularity, sockets on 127.0.0.1,
and SGLang's / vLLM's own KVEventBatch decoders rebuilt from the fixtures."""
from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any, Union

import msgspec

from core.kv_events.hashing import BlockHasher

LOCAL = "tcp://127.0.0.1:0"   # bind an OS-chosen free port
FIX = os.path.join(os.path.dirname(__file__), "fixtures")
_SCALARS = {"int": int, "float": float, "str": str, "bytes": bytes, "none": type(None), "any": Any, "bool": bool}


def engine_decoder(engine: str) -> msgspec.msgpack.Decoder:
    """`engine`'s own KVEventBatch decoder: the same msgspec structs (names, tags, field order, which
    fields are required, their types), rebuilt from what scripts/make_kv_event_fixtures.py read of
    them in the engine's wheel (fixtures/decoders.json), since the tests do not import sglang/vllm."""
    with open(os.path.join(FIX, "decoders.json")) as f:
        doc = json.load(f)[engine]
    built: dict = {}

    def struct(name: str):
        if name not in built:
            spec = doc["structs"][name]
            fields = [(f["name"], build(f["type"])) if f["required"] else (f["name"], build(f["type"]), None)
                      for f in spec["fields"]]
            kw = {"array_like": spec["array_like"], "forbid_unknown_fields": spec["forbid_unknown_fields"]}
            if spec["tag"] is not None:
                kw.update(tag=spec["tag"], tag_field=spec["tag_field"])
            built[name] = msgspec.defstruct(name, fields, **kw)
        return built[name]

    def build(node: dict):
        kind = node["kind"]
        if kind == "struct":
            return struct(node["name"])
        if kind == "list":
            return list[build(node["item"])]
        if kind == "vartuple":
            return tuple[build(node["item"]), ...]
        if kind == "union":
            return Union[tuple(build(t) for t in node["types"])]
        return _SCALARS[kind]

    return msgspec.msgpack.Decoder(build(doc["root"]))


def radix_prefixes(snap) -> Counter:
    """One entry per page of every node: the tokens from the root through that page (cf. BlockTree.prefixes)."""
    ps = snap.page_size
    above = {snap.root_id: ()}
    out: Counter = Counter()
    for n in snap.nodes:
        if n.parent is None:
            continue
        base = above[n.parent]
        for k in range(len(n.token_ids) // ps):
            out[base + tuple(n.token_ids[:(k + 1) * ps])] += 1
        above[n.id] = base + tuple(n.token_ids)
    return out


def radix_hashes(snap, scheme: str = "sglang", fmt: str = "default") -> dict:
    """Block hash -> (parent hash, page tokens) computed from the radix tree with a fresh hasher."""
    hasher = BlockHasher(snap.page_size, scheme, fmt)
    chains = {snap.root_id: (None, None, None)}   # node -> (last digest, last hash, extra_key)
    out = {}
    ps = snap.page_size
    for n in snap.nodes:
        if n.parent is None:
            continue
        prior, parent_hash, extra = chains[n.parent]
        extra = n.extra_key if n.parent == snap.root_id else extra
        digests, hashes = hasher.chain(prior, n.token_ids, extra)
        for i, h in enumerate(hashes):
            out[h] = (parent_hash, tuple(n.token_ids[i * ps:(i + 1) * ps]))
            parent_hash = h
        chains[n.id] = (digests[-1] if digests else prior, parent_hash, extra)
    return out


def tree_hashes(tree) -> dict:
    return {k[1]: (None if b.parent is None else b.parent[1], b.tokens) for k, b in tree.blocks.items()}
