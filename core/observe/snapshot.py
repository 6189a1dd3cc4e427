"""Immutable, JSON-serialisable views of the cache, the pool and the engine.

The dashboard only ever sees these, never live objects, so a view can be drawn while the
engine thread keeps mutating the tree, and the same views could come from a remote engine.
"""
from __future__ import annotations

import dataclasses
import heapq
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

if TYPE_CHECKING:
    from core.cache.radix_cache import RadixCache

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
    eviction_order: Sequence[int]          # node ids, next victim first (an EvictionOrder: lazy, tuple-like)

    def node(self, node_id: int) -> NodeView:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def free_slots(self) -> tuple[int, ...]:
        ps = self.page_size
        return tuple(p * ps + i for p in self.free_pages for i in range(ps))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)   # EvictionOrder deep-copies to a tuple


# each cache's incremental state (the last snapshot and what it was built from), kept here, not on the cache
_MEMOS: "weakref.WeakKeyDictionary[RadixCache, dict]" = weakref.WeakKeyDictionary()


def forget_snapshots(cache: "RadixCache") -> None:
    """Drop `cache`'s incremental state: its next snapshot is built in full (a check that both agree)."""
    _MEMOS.pop(cache, None)


def snapshot_cache(cache: "RadixCache") -> CacheSnapshot:
    """The cache as one immutable value, built incrementally from the events since the last one:
    only the nodes those events name (and their ancestors, whose clocks a walk stamps) get a new
    NodeView; the node order is reused unless the tree's shape changed, the eviction order and
    free list unless a tree or pool event happened; with no event at all, the previous snapshot
    itself comes back. With events off or lost (the log dropped them), it rebuilds in full."""
    log = cache.events
    memo: dict = _MEMOS.setdefault(cache, {})
    tracked = log.enabled and memo.get("root") is cache.root_node
    key = (log.last_seq, cache.clock())
    if tracked and memo.get("key") == key:
        return memo["snap"]
    if tracked and memo.get("tree_seq") == log.last_tree_seq:
        nodes, order = memo["nodes"], memo["order"]
    else:
        nodes = _node_views(cache, memo, tracked)
        order = eviction_order_of(cache, nodes)
    pool_key = (log.last_pool_seq, cache.allocator.available())
    if tracked and memo.get("pool_key") == pool_key:
        free = memo["free"]
    else:
        free = tuple(cache.allocator.free_pages.tolist())
    out = CacheSnapshot(
        seq=log.last_seq, time=cache.clock(), policy=cache.policy_name,
        page_size=cache.page_size, num_slots=cache.allocator.num_slots, root_id=cache.root_node.id,
        nodes=nodes, free_pages=free, evictable_size=cache.evictable_size(),
        protected_size=cache.protected_size(), total_size=cache.total_size(), eviction_order=order)
    memo.update(key=key, snap=out, tree_seq=log.last_tree_seq, nodes=nodes, order=order, pool_key=pool_key,
                free=free, root=cache.root_node, seq=log.last_seq)
    return out


def _changed_since(cache: "RadixCache", memo: dict) -> Optional[tuple[set, bool]]:
    """(ids of nodes the events since the memo touched, whether the shape changed); None if unknown."""
    last = memo.get("seq")
    if last is None or cache.events.last_seq - last > 4 * len(memo.get("views", ())) + 64:
        return None
    events = cache.events.since(last)
    if events and events[0].seq != last + 1:
        return None   # the log dropped some
    dirty, shape = {cache.root_node.id}, False
    for e in events:
        kind = e.kind
        if kind in ("alloc", "free"):
            continue
        if kind in ("match", "touch", "lock", "unlock"):
            dirty.update(e.path)
        elif kind == "split":
            dirty.update((e.node, e.new_parent))
            shape = True
        elif kind in ("insert", "evict"):
            dirty.update((e.node, e.parent))
            shape = True
        else:
            return None
    return dirty, shape


def _node_views(cache: "RadixCache", memo: dict, tracked: bool) -> tuple[NodeView, ...]:
    old: dict = memo.get("views", {}) if tracked else {}
    change = _changed_since(cache, memo) if tracked else None
    if change is not None and not change[1]:   # same shape: replace the touched views in place
        dirty, _ = change
        out, pos = list(memo["nodes"]), memo["pos"]
        for nid in _with_ancestors(dirty, {i: e[0] for i, e in old.items()}):
            if nid in pos:
                n = old[nid][0]
                view = _view(cache, n)
                old[nid] = (n, n.key, n.value, view)
                out[pos[nid]] = view
        return tuple(out)
    live = cache.nodes()
    if change is None:
        recompute = None
    else:
        recompute = _with_ancestors(change[0], {n.id: n for n in live})
    views: dict = {}
    out = []
    for n in live:
        e = old.get(n.id)
        if (recompute is not None and n.id not in recompute and e is not None and e[0] is n
                and e[1] is n.key and e[2] is n.value):
            view = e[3]
        else:
            view = _view(cache, n)
        views[n.id] = (n, n.key, n.value, view)
        out.append(view)
    memo["views"] = views
    memo["pos"] = {v.id: i for i, v in enumerate(out)}
    return tuple(out)


def _with_ancestors(ids: set, by_id: dict) -> set:
    out = set(ids)
    for nid in ids:
        n = by_id.get(nid)
        while n is not None and n.parent is not None and n.parent.id not in out:
            n = n.parent
            out.add(n.id)
    return out


def _view(cache: "RadixCache", n) -> NodeView:
    return NodeView(
        id=n.id, parent=None if n.parent is None else n.parent.id,
        token_ids=tuple(n.key.token_ids.tolist()), slots=tuple(n.value.tolist()),
        last_access_time=n.last_access_time, creation_time=n.creation_time, hit_count=n.hit_count,
        lock_ref=n.lock_ref if n is not cache.root_node else 0, priority=n.priority,
        is_leaf=n.is_leaf, evictable=n in cache.evictable_leaves, extra_key=n.key.extra_key)


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
    version: int = 0           # the engine's version() when this was built: equal to it while current
    engine_id: str = ""        # which engine built it: a rebuilt or restarted one has another ("" from an older one)
    redacted: bool = False     # token ids zeroed, texts gone (a server's answer to a caller without the admin key)

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "step": self.step, "cache": self.cache.to_dict(), "pool": self.pool.to_dict(),
                "requests": [dataclasses.asdict(r) for r in self.requests], "metrics": dict(self.metrics),
                "token_text": {str(k): v for k, v in self.token_text.items()}, "version": self.version,
                "engine_id": self.engine_id, "redacted": self.redacted}


def frozen_array(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


class EvictionOrder(Sequence):
    """Node ids in the order `RadixCache.eviction_order()` gives (lowest policy key first, node id
    breaking ties; a parent joins when its last child goes), computed from a snapshot's immutable
    views only as far as someone reads: `[0]` costs a heapify and one pop, not the whole walk.
    Behaves as a tuple (==, slicing, len, JSON via to_dict, copy and pickle give a tuple)."""

    def __init__(self, policy, nodes: tuple[NodeView, ...], root_id: int) -> None:
        self._policy, self._root = policy, root_id
        self._by_id = {n.id: n for n in nodes}
        self._children: dict[int, int] = {}
        for n in nodes:
            if n.parent is not None:
                self._children[n.parent] = self._children.get(n.parent, 0) + 1
        self._heap = [(policy(n), n.id) for n in nodes if n.evictable]
        heapq.heapify(self._heap)
        self._done: list[int] = []
        self._lock = threading.Lock()

    def _ensure(self, k: Optional[int]) -> None:
        with self._lock:
            heap, done, by_id, children = self._heap, self._done, self._by_id, self._children
            while heap and (k is None or len(done) < k):
                _, nid = heapq.heappop(heap)
                done.append(nid)
                pid = by_id[nid].parent
                if pid == self._root or by_id[pid].lock_ref > 0:
                    continue
                children[pid] -= 1
                if children[pid] == 0:
                    heapq.heappush(heap, (self._policy(by_id[pid]), pid))

    def __getitem__(self, i):
        if isinstance(i, slice):
            stop = i.stop if i.stop is not None and i.stop >= 0 and (i.start or 0) >= 0 and (i.step or 1) > 0 else None
            self._ensure(stop)
            return tuple(self._done[i])
        self._ensure(i + 1 if i >= 0 else None)
        return self._done[i]

    def __len__(self) -> int:
        self._ensure(None)
        return len(self._done)

    def __bool__(self) -> bool:
        self._ensure(1)
        return bool(self._done)

    def __iter__(self):
        i = 0
        while True:
            self._ensure(i + 1)
            if i >= len(self._done):
                return
            yield self._done[i]
            i += 1

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list, EvictionOrder)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __copy__(self) -> tuple:
        return tuple(self)

    def __deepcopy__(self, memo) -> tuple:
        return tuple(self)

    def __reduce__(self):
        return (tuple, (tuple(self),))


def eviction_order_of(cache: "RadixCache", nodes: tuple[NodeView, ...]):
    """A lazy EvictionOrder when the policy reads only what a NodeView holds; else computed now."""
    try:
        if len(nodes) > 1:
            cache.policy(nodes[1])
        return EvictionOrder(cache.policy, nodes, cache.root_node.id)
    except AttributeError:   # a policy that reads more of the node than a view keeps
        return tuple(n.id for n in cache.eviction_order())
