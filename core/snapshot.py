"""Immutable, JSON-serialisable views of the cache, the pool and the engine.

The dashboard only ever sees these, never live objects, so a view can be drawn while the
engine thread keeps mutating the tree, and the same views could come from a remote engine.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

if TYPE_CHECKING:
    from core.radix_cache import RadixCache

# Slot states, in the article's words. Codes index SLOT_STATES (numpy arrays store the codes).
SLOT_STATES = ("padding", "never_written", "free_stale", "evictable", "locked", "in_use")
PADDING, NEVER_WRITTEN, FREE_STALE, EVICTABLE, LOCKED, IN_USE = range(len(SLOT_STATES))


@dataclass(frozen=True)
class NodeView:
    id: int
    parent: Optional[int]
    token_ids: tuple[int, ...]
    slots: tuple[int, ...]
    last_access_time: float
    creation_time: float
    hit_count: int
    lock_ref: int
    priority: int
    is_leaf: bool
    evictable: bool            # an unlocked leaf: in evictable_leaves
    extra_key: Optional[str] = None


@dataclass(frozen=True)
class CacheSnapshot:
    seq: int                   # last event sequence number when taken
    time: float                # the cache clock when taken
    policy: str
    page_size: int
    num_slots: int
    root_id: int
    nodes: tuple[NodeView, ...]            # root first, parents before children
    free_pages: tuple[int, ...]            # in allocator order (front is handed out next)
    evictable_size: int
    protected_size: int
    total_size: int
    eviction_order: tuple[int, ...]        # node ids, next victim first

    def node(self, node_id: int) -> NodeView:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def free_slots(self) -> tuple[int, ...]:
        ps = self.page_size
        return tuple(p * ps + i for p in self.free_pages for i in range(ps))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def snapshot_cache(cache: "RadixCache") -> CacheSnapshot:
    nodes = []
    for n in cache.nodes():
        nodes.append(NodeView(
            id=n.id, parent=None if n.parent is None else n.parent.id,
            token_ids=tuple(n.key.token_ids.tolist()), slots=tuple(n.value.tolist()),
            last_access_time=n.last_access_time, creation_time=n.creation_time, hit_count=n.hit_count,
            lock_ref=n.lock_ref if n is not cache.root_node else 0, priority=n.priority,
            is_leaf=n.is_leaf, evictable=n in cache.evictable_leaves, extra_key=n.key.extra_key))
    return CacheSnapshot(
        seq=cache.events.last_seq, time=cache.clock(), policy=cache.policy_name,
        page_size=cache.page_size, num_slots=cache.allocator.num_slots, root_id=cache.root_node.id,
        nodes=tuple(nodes), free_pages=tuple(cache.allocator.free_pages.tolist()),
        evictable_size=cache.evictable_size(), protected_size=cache.protected_size(),
        total_size=cache.total_size(), eviction_order=tuple(n.id for n in cache.eviction_order()))


def slot_states(cache: CacheSnapshot, written: np.ndarray, in_use: np.ndarray) -> np.ndarray:
    """State code per slot 0..N: padding, never written, free but stale, evictable, locked, in use.

    `written[i]`: slot i has ever held KV. `in_use`: slots running requests hold outside the tree.
    """
    size = cache.num_slots + cache.page_size
    states = np.full(size, NEVER_WRITTEN, dtype=np.int8)
    states[written.astype(bool)] = FREE_STALE
    for n in cache.nodes:
        if n.slots:
            states[list(n.slots)] = LOCKED if n.lock_ref > 0 else EVICTABLE
    if len(in_use):
        states[np.asarray(in_use, dtype=np.int64)] = IN_USE
    states[:cache.page_size] = PADDING
    return states


@dataclass(frozen=True)
class RequestView:
    rid: str
    state: str                 # waiting, running, finished, aborted
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    prompt_text: str
    output_text: str
    finish_reason: Optional[str]
    ttft: Optional[float]      # seconds from submit to first token
    total_time: Optional[float]
    error: Optional[str] = None


@dataclass(frozen=True)
class PoolView:
    num_layers: int
    num_slots: int
    page_size: int
    states: np.ndarray         # int8 [slots]: codes into SLOT_STATES
    slot_tokens: np.ndarray    # int64 [slots]: last token id written to the slot, -1 if never
    k_norms: Optional[np.ndarray]  # float32 [layers, slots]: norm of K in k_buffer; None without KV

    def to_dict(self) -> dict[str, Any]:
        return {"num_layers": self.num_layers, "num_slots": self.num_slots, "page_size": self.page_size,
                "states": self.states.tolist(), "slot_tokens": self.slot_tokens.tolist(),
                "k_norms": None if self.k_norms is None else self.k_norms.tolist()}


@dataclass(frozen=True)
class EngineSnapshot:
    seq: int
    step: int
    cache: CacheSnapshot
    pool: PoolView
    requests: tuple[RequestView, ...]
    metrics: dict[str, float]
    token_text: dict[int, str] = field(default_factory=dict)  # token id -> its decoded piece

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "step": self.step, "cache": self.cache.to_dict(), "pool": self.pool.to_dict(),
                "requests": [dataclasses.asdict(r) for r in self.requests], "metrics": dict(self.metrics),
                "token_text": {str(k): v for k, v in self.token_text.items()}}


def frozen_array(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a
