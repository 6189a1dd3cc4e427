"""Shared by the KV event tests: the engine's radix tree at page granularity, and sockets on 127.0.0.1."""
from __future__ import annotations

from collections import Counter

from core.kv_events.hashing import BlockHasher

LOCAL = "tcp://127.0.0.1:0"   # bind an OS-chosen free port


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


def radix_hashes(snap, scheme: str = "sglang") -> dict:
    """Block hash -> (parent hash, page tokens) computed from the radix tree with a fresh hasher."""
    hasher = BlockHasher(snap.page_size, scheme)
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
