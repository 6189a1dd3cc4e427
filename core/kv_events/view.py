"""A rebuilt block tree as a `CacheSnapshot`, so the Live page's figures draw it unchanged.

Chains of blocks where each block has exactly one child become one radix node (as the engine's
own radix tree would hold them); a node's id is its first block's serial number (order of first
store, root 0) so ids stay put across refreshes, and its "slots" are the serial numbers of its
blocks, which the figures print under the node. Orphans (parent not in the cache) hang under the
root. `notes` carries each node's tiers and orphan flag for the hover.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from core.kv_events.block_tree import BlockTree
from core.observe.snapshot import CacheSnapshot, NodeView

ROOT_ID = 0


@dataclass(frozen=True)
class BlockView:
    cache: CacheSnapshot
    node_of_block: dict         # block key -> node id
    inserted: frozenset         # node ids holding blocks the latest batch stored
    evicted: tuple              # (node id, tokens, block serials) of blocks that left in the latest batch


def block_snapshot(tree: BlockTree, seq: int = 0, t0: Optional[float] = None) -> BlockView:
    """Build the view; call with the follower's lock held (the tree must not change meanwhile)."""
    blocks = tree.blocks
    t0 = t0 if t0 is not None else (tree.rates[0][0] if tree.rates else 0.0)
    nodes = [NodeView(id=ROOT_ID, parent=None, token_ids=(), slots=(), last_access_time=0.0, creation_time=0.0,
                      hit_count=0, lock_ref=0, priority=0, is_leaf=not blocks, evictable=False)]
    node_of: dict = {}
    stack = [(k, ROOT_ID) for k in reversed(tree.top_level())]
    while stack:
        key, parent = stack.pop()
        chain = [blocks[key]]
        while len(chain[-1].children) == 1:
            (only,) = chain[-1].children
            chain.append(blocks[only])
        nid = chain[0].serial
        for b in chain:
            node_of[b.key] = nid
        last = chain[-1]
        tiers = sorted(set().union(*(b.media for b in chain)))
        note = "tiers " + "+".join(tiers) + (" · orphan: parent block not cached" if key in tree.orphans else "")
        nodes.append(NodeView(id=nid, parent=parent, token_ids=tuple(t for b in chain for t in b.tokens),
                              slots=tuple(b.serial for b in chain), last_access_time=round(last.last_ts - t0, 3),
                              creation_time=round(chain[0].stored_ts - t0, 3),
                              hit_count=sum(b.restores for b in chain), lock_ref=0, priority=0,
                              is_leaf=not last.children, evictable=not last.children, extra_key=note))
        kids = sorted(last.children, key=lambda k: blocks[k].serial)
        stack.extend((k, nid) for k in reversed(kids))
    tokens = sum(len(b.tokens) for b in blocks.values())
    size = max(1, max((len(b.tokens) for b in blocks.values()), default=1))
    snap = CacheSnapshot(seq=seq, time=round((tree.rates[-1][0] - t0) if tree.rates else 0.0, 3),
                         policy="engine's own", page_size=size, num_slots=len(blocks), root_id=ROOT_ID,
                         nodes=tuple(nodes), free_pages=(), evictable_size=tokens, protected_size=0,
                         total_size=tokens, eviction_order=())
    last_ts = tree.rates[-1][0] if tree.rates else None
    gone = tuple((r.serial, r.tokens, (r.serial,)) for r in tree.removals if r.ts == last_ts and r.left_tree)
    inserted = frozenset(node_of[k] for k in tree.last_stored if k in node_of)
    return BlockView(snap, node_of, inserted, gone)
