"""The block tree a subscriber rebuilds from KV events: every block hangs under its parent hash.

A block is one page of tokens. It lives in one or more tiers (`medium`: GPU, CPU, DISK...);
a BlockRemoved takes it out of one tier, and it leaves the tree when no tier holds it. A
stored block whose parent is unknown (we joined late, a batch was lost, or vLLM evicted the
parent first) is an orphan: kept and counted, because a prefix lookup can never reach it.
Blocks are keyed by (group_idx, hash): vLLM's hybrid models hash per KV cache group.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Optional

from core.kv_events.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, medium_name

Key = tuple  # (group_idx or 0, block hash)


@dataclass
class Block:
    key: Key
    parent: Optional[Key]            # the parent's key, None under the root
    tokens: tuple
    serial: int                      # order of first store: a stable id for views
    stored_ts: float
    media: set = field(default_factory=set)
    children: set = field(default_factory=set)
    lora_id: Optional[int] = None
    lora_name: Optional[str] = None
    cache_salt: Optional[str] = None  # the namespace it was stored in (its store's, else its parent's)
    restores: int = 0                # BlockStored again while cached (vLLM reports prefix reuse so)
    last_ts: float = 0.0


@dataclass(frozen=True)
class Removal:
    """One block leaving the tree (all tiers gone) or a tier, for the evictions view."""
    ts: float
    seq: int
    key: Key
    medium: str
    tokens: tuple
    left_tree: bool
    serial: int = 0


class BlockTree:
    def __init__(self, history: int = 2000) -> None:
        self.blocks: dict[Key, Block] = {}
        self.roots: set[Key] = set()           # blocks whose parent_block_hash was None
        self.orphans: set[Key] = set()         # blocks whose parent is not in the tree
        self._waiting: dict[Key, set] = {}     # missing parent -> its orphaned children
        self._serial = 0
        self.stored_total = 0                   # blocks newly stored, all time
        self.removed_total = 0                  # blocks that left the tree, all time
        self.unknown_removals = 0               # BlockRemoved for a hash we never saw
        self.clears = 0
        self.removals: deque[Removal] = deque(maxlen=history)
        self.log: deque[tuple] = deque(maxlen=history)   # (seq, ts, kind, description dict)
        self.rates: deque[tuple] = deque(maxlen=history)  # (ts, blocks stored, blocks removed) per batch
        self.last_stored: list[Key] = []        # keys stored by the latest batch
        self.before_event = None                # optional hook(event, ts), called before each event applies

    # ----- applying events --------------------------------------------------------------------
    def apply(self, batch: KVEventBatch, seq: int = -1) -> None:
        stored = removed = 0
        self.last_stored = []
        for ev in batch.events:
            if self.before_event is not None:
                self.before_event(ev, batch.ts)
            if isinstance(ev, BlockStored):
                stored += self._store(ev, batch.ts, seq)
            elif isinstance(ev, BlockRemoved):
                removed += self._remove(ev, batch.ts, seq)
            elif isinstance(ev, AllBlocksCleared):
                removed += len(self.blocks)
                self.clear()
                self.clears += 1
                self.log.append((seq, batch.ts, "AllBlocksCleared", {}))
        self.rates.append((batch.ts, stored, removed))

    def clear(self) -> None:
        self.removed_total += len(self.blocks)
        self.blocks.clear()
        self.roots.clear()
        self.orphans.clear()
        self._waiting.clear()

    def _store(self, ev: BlockStored, ts: float, seq: int) -> int:
        group = ev.group_idx or 0
        parent = None if ev.parent_block_hash is None else (group, ev.parent_block_hash)
        medium = medium_name(ev.medium)
        bs = ev.block_size if ev.block_size > 0 else 1
        salt = self.namespace(ev)[0]      # the chain's, for each block it adds
        new = 0
        above: Optional[set] = None   # _ancestors(parent) while known: one walk up an event's chain, not one
        for i, h in enumerate(ev.block_hashes):   # an adoption (a long chain adopting many orphans was quadratic)
            key = (group, h)
            tokens = tuple(t if isinstance(t, int) else tuple(t) for t in ev.token_ids[i * bs:(i + 1) * bs])
            b = self.blocks.get(key)
            if b is None:
                self._serial += 1
                b = Block(key, parent, tokens, self._serial, ts, lora_id=ev.lora_id, lora_name=ev.lora_name,
                          cache_salt=salt, last_ts=ts)
                self.blocks[key] = b
                self._link(b)
                if above is not None:
                    above.add(key)               # a new block's chain is its parent's, one longer
                waiting = self._waiting.pop(key, ())
                if waiting and above is None:
                    above = self._ancestors(key)
                for child in waiting:            # a late parent adopts its children
                    if child in above:           # A under B, then B under A: no chain reaches a root
                        continue                 # (a publisher's bug): the child stays an orphan
                    self.orphans.discard(child)
                    b.children.add(child)
                new += 1
                self.last_stored.append(key)
            else:
                b.restores += 1
                b.last_ts = ts
                if b.parent != parent:           # stored before under another parent: its own chain
                    above = None
                elif above is not None:
                    above.add(key)
            b.media.add(medium)
            parent = key
        self.stored_total += new
        self.log.append((seq, ts, "BlockStored", {"blocks": len(ev.block_hashes), "new": new, "medium": medium,
                                                  "parent": ev.parent_block_hash, "tokens": len(ev.token_ids)}))
        return new

    def _ancestors(self, key: Key) -> set:
        """The blocks above `key`, itself included, up to a root, a missing block or a repeat (a cycle)."""
        seen: set = set()
        while key is not None and key in self.blocks and key not in seen:
            seen.add(key)
            key = self.blocks[key].parent
        return seen

    def _link(self, b: Block) -> None:
        if b.parent == b.key:       # stored under itself (a publisher's bug): an orphan, not a loop
            self.orphans.add(b.key)
        elif b.parent is None:
            self.roots.add(b.key)
        elif b.parent in self.blocks:
            self.blocks[b.parent].children.add(b.key)
        else:
            self._orphan(b.key, b.parent)

    def _orphan(self, key: Key, parent: Key) -> None:
        self.orphans.add(key)
        self._waiting.setdefault(parent, set()).add(key)

    def _remove(self, ev: BlockRemoved, ts: float, seq: int) -> int:
        group = ev.group_idx or 0
        medium = medium_name(ev.medium)
        gone = unknown = 0
        for h in ev.block_hashes:
            key = (group, h)
            b = self.blocks.get(key)
            if b is None or medium not in b.media:
                unknown += 1
                continue
            b.media.discard(medium)
            left = not b.media
            self.removals.append(Removal(ts, seq, key, medium, b.tokens, left, b.serial))
            if left:
                self._drop(b)
                gone += 1
        self.unknown_removals += unknown
        self.removed_total += gone
        self.log.append((seq, ts, "BlockRemoved", {"blocks": len(ev.block_hashes), "gone": gone,
                                                   "unknown": unknown, "medium": medium}))
        return gone

    def _drop(self, b: Block) -> None:
        del self.blocks[b.key]
        self.roots.discard(b.key)
        if b.key in self.orphans:
            self.orphans.discard(b.key)
            waiting = self._waiting.get(b.parent)
            if waiting is not None:
                waiting.discard(b.key)
                if not waiting:
                    del self._waiting[b.parent]
        elif b.parent is not None and b.parent in self.blocks:
            self.blocks[b.parent].children.discard(b.key)
        for child in b.children:  # children of a removed block can no longer be reached
            if child in self.blocks:
                self._orphan(child, b.key)

    # ----- views --------------------------------------------------------------------------------
    def top_level(self) -> list[Key]:
        """Blocks drawn under the root: true roots, then orphans, in store order."""
        return sorted(self.roots | self.orphans, key=lambda k: self.blocks[k].serial)

    def namespace(self, ev: BlockStored) -> tuple[Optional[str], Optional[str]]:
        """(cache_salt, LoRA name or id) of a store: its own, else its parent block's (a chain's later stores may
        leave them out)."""
        parent = (ev.group_idx or 0, ev.parent_block_hash) if ev.parent_block_hash is not None else None
        up = self.blocks.get(parent) if parent is not None else None
        salt = ev.cache_salt if ev.cache_salt is not None or up is None else up.cache_salt
        lora = ev.lora_name or (None if ev.lora_id is None else str(ev.lora_id))
        if lora is None and up is not None:
            lora = up.lora_name or (None if up.lora_id is None else str(up.lora_id))
        return salt, lora

    def path_tokens(self, key: Key) -> tuple:
        """Every token from the top of the block's chain down to and including the block."""
        out, seen = [], set()
        while key is not None and key in self.blocks and key not in seen:   # a cycle ends the walk
            seen.add(key)
            b = self.blocks[key]
            out.append(b.tokens)
            key = b.parent
        return tuple(t for toks in reversed(out) for t in toks)

    def chain_known(self, key: Optional[Key]) -> bool:
        """Whether every block from `key` up to a root is held (None: under the root), so the
        tokens before a block stored under `key` are all known."""
        seen = set()
        while key is not None:
            b = self.blocks.get(key)
            if b is None or key in seen:   # missing, or a cycle (a publisher's bug): never reaches a root
                return False
            seen.add(key)
            key = b.parent
        return True

    def prefixes(self) -> Counter:
        """Multiset of token prefixes, one per block: equal for two trees exactly when they hold
        the same blocks in the same places (what the tests compare with the engine's radix tree)."""
        out: Counter = Counter()
        stack = [(k, ()) for k in self.top_level()]
        while stack:
            k, above = stack.pop()
            b = self.blocks[k]
            here = above + b.tokens
            out[here] += 1
            stack.extend((c, here) for c in b.children)
        return out

    def media_counts(self) -> dict[str, int]:
        c: Counter = Counter()
        for b in self.blocks.values():
            c.update(b.media)
        return dict(sorted(c.items()))

    def stats(self) -> dict[str, Any]:
        """Figures a hit-rate question needs: size, depth, sharing, orphans."""
        depth, leaves, path_sum, branch = 0, 0, 0, 0
        stack = [(k, 1) for k in self.top_level()]
        while stack:
            k, d = stack.pop()
            b = self.blocks[k]
            depth = max(depth, d)
            if not b.children:
                leaves += 1
                path_sum += d
            elif len(b.children) > 1:
                branch += 1
            stack.extend((c, d + 1) for c in b.children)
        n = len(self.blocks)
        return {"blocks": n, "leaves": leaves, "max_depth": depth, "branch_blocks": branch,
                "orphans": len(self.orphans), "top_level": len(self.roots | self.orphans),
                # blocks each leaf's sequence would need without sharing, over the blocks held
                "sharing": (path_sum / n) if n else 0.0,
                "stored_total": self.stored_total, "removed_total": self.removed_total,
                "unknown_removals": self.unknown_removals, "clears": self.clears}

    def rate(self, window_s: float = 10.0) -> tuple[float, float]:
        """Blocks stored and removed per second over the last `window_s` seconds of batch time."""
        if not self.rates:
            return 0.0, 0.0
        end = self.rates[-1][0]
        rows = [r for r in self.rates if r[0] >= end - window_s]
        span = max(end - rows[0][0], 1e-9) if len(rows) > 1 else window_s
        return sum(r[1] for r in rows) / span, sum(r[2] for r in rows) / span
