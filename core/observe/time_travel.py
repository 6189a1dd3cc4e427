"""Time travel: rebuild the tree and free_pages as they were after any event, from the event log.

A plain-dict model of the cache replays match / split / insert / touch / evict / alloc / free /
lock / unlock / reset events in order, mirroring what RadixCache does for each; the result is a
CacheSnapshot, so the same figure builders draw the past. Start from `empty_snapshot(...)` (the
cache at its reset) or from any snapshot, with the events that came after it.

What events do not carry, and so cannot come back: request priorities (0 unless the initial
snapshot had them), and a stateful policy's state (arc, s3fifo, lecar, lhd, gdsf): their past
eviction order is an LRU approximation (`replay_note` says so on the page). An `insert` that added nothing still stamps its path: the cache records that
as a `touch` event, replayed here like the stamps of a match or of an insert that adds a leaf. Replaying a run from its reset therefore equals
`snapshot_cache(cache)` for the node ids, parents, tokens, slots, lock_ref, times, hit counts and
free_pages whenever priorities were not used.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import numpy as np

from core.cache.events import EventLike, ev_get, ev_kind
from core.cache.eviction.registry import POLICIES, is_stateful
from core.observe.snapshot import CacheSnapshot, NodeView, PoolView, slot_states


def replay_note(policy: str) -> Optional[str]:
    """For a stateful policy: a plain word that the replayed next victim is an approximation."""
    if not is_stateful(policy):
        return None
    return (f"`{policy}` is a stateful policy: its state is not in the event log, so the past trees here mark "
            f"the next victim by LRU order, an approximation. The live tree and the Eviction heap show "
            f"`{policy}`'s real order.")


@dataclass
class _Node:
    id: int
    parent: Optional[int]
    token_ids: list
    slots: list
    last_access_time: float
    creation_time: float
    hit_count: int = 0
    lock_ref: int = 0
    priority: int = 0
    extra_key: Optional[str] = None
    children: dict = field(default_factory=dict)   # child key -> child id, in insertion order

    # the attributes eviction policies read
    def view(self, root_id: int, evictable: bool) -> NodeView:
        return NodeView(id=self.id, parent=self.parent, token_ids=tuple(self.token_ids), slots=tuple(self.slots),
                        last_access_time=self.last_access_time, creation_time=self.creation_time,
                        hit_count=self.hit_count, lock_ref=self.lock_ref if self.id != root_id else 0,
                        priority=self.priority, is_leaf=not self.children, evictable=evictable,
                        extra_key=self.extra_key)


def empty_snapshot(num_slots: int, page_size: int = 1, policy: str = "lru", time: float = 0,
                   seq: int = 0) -> CacheSnapshot:
    """The cache right after a reset: a root (id 0) and every page free, in order 1..N."""
    root = NodeView(id=0, parent=None, token_ids=(), slots=(), last_access_time=time, creation_time=time,
                    hit_count=0, lock_ref=0, priority=0, is_leaf=True, evictable=False)
    return CacheSnapshot(seq=seq, time=time, policy=policy, page_size=page_size, num_slots=num_slots, root_id=0,
                         nodes=(root,), free_pages=tuple(range(1, num_slots // page_size + 1)), evictable_size=0,
                         protected_size=0, total_size=0, eviction_order=())


class CacheModel:
    """The replayed cache: nodes, free_pages, and what slots were ever written (for slot states)."""

    def __init__(self, initial: CacheSnapshot) -> None:
        self.policy = initial.policy
        self.page_size = initial.page_size
        self.num_slots = initial.num_slots
        self.root_id = initial.root_id
        self.seq = initial.seq
        self.time = initial.time
        self.nodes: dict[int, _Node] = {}
        for v in initial.nodes:
            self.nodes[v.id] = _Node(v.id, v.parent, list(v.token_ids), list(v.slots), v.last_access_time,
                                     v.creation_time, v.hit_count, v.lock_ref, v.priority, v.extra_key)
        for v in initial.nodes:
            if v.parent is not None:
                p = self.nodes[v.parent]
                p.children[self.child_key(self.nodes[v.id])] = v.id
        self.free_pages: list[int] = list(initial.free_pages)
        size = self.num_slots + self.page_size
        self.written = np.zeros(size, dtype=bool)
        self.slot_tokens = np.full(size, -1, dtype=np.int64)
        for v in initial.nodes:
            if v.slots:
                self.written[list(v.slots)] = True
                self.slot_tokens[list(v.slots)] = v.token_ids
        self.next_id = max(self.nodes) + 1
        self._last_extra_key: Optional[str] = None

    # ----- helpers ---------------------------------------------------------------------------
    def child_key(self, node: _Node) -> Any:
        first = tuple(node.token_ids[:self.page_size])
        return (node.extra_key, first)

    def _pages(self, slots: Iterable[int]) -> list[int]:
        ps = self.page_size
        return [s // ps for s in list(slots)[::ps]]

    def _touch_path(self, node_id: int, time: float) -> None:
        n: Optional[int] = node_id
        while n is not None:
            self.nodes[n].last_access_time = time
            n = self.nodes[n].parent

    def _count(self, node_ids: Iterable[int]) -> None:
        for nid in node_ids or ():
            self.nodes[int(nid)].hit_count += 1

    # ----- events ----------------------------------------------------------------------------
    def apply(self, e: EventLike) -> None:
        kind, t = ev_kind(e), ev_get(e, "time", self.time)
        g = lambda name, default=None: ev_get(e, name, default)  # noqa: E731
        if kind == "match":
            self.nodes[self.root_id].last_access_time = t
            self._last_extra_key = g("extra_key")
            for nid in g("path", ()) or ():
                self.nodes[int(nid)].last_access_time = t
        elif kind == "split":
            child = self.nodes[int(g("node"))]
            pos = int(g("position"))
            parent = self.nodes[child.parent]
            new = _Node(int(g("new_parent")), parent.id, child.token_ids[:pos], child.slots[:pos], t,
                        t, child.hit_count, child.lock_ref, child.priority, child.extra_key)
            parent.children[self.child_key(child)] = new.id   # same first token: keeps its place
            child.token_ids, child.slots = child.token_ids[pos:], child.slots[pos:]
            child.parent = new.id
            child.last_access_time = t
            new.children[self.child_key(child)] = child.id
            self.nodes[new.id] = new
            self.next_id = max(self.next_id, new.id + 1)
        elif kind == "insert":
            parent = self.nodes[int(g("parent"))]
            extra = parent.extra_key if parent.id != self.root_id else self._last_extra_key
            node = _Node(int(g("node")), parent.id, list(g("token_ids", ())), list(g("slots", ())), t, t,
                         extra_key=extra)
            self._touch_path(parent.id, t)
            parent.children[self.child_key(node)] = node.id
            self.nodes[node.id] = node
            self.next_id = max(self.next_id, node.id + 1)
            if node.slots:
                self.written[node.slots] = True
                self.slot_tokens[node.slots] = node.token_ids
            self._count(g("counted", ()))
        elif kind == "touch":                 # an insert that added nothing stamps its path
            self._touch_path(int(g("node")), t)
            self._count(g("counted", ()))
        elif kind == "evict":
            node = self.nodes.pop(int(g("node")))
            parent = self.nodes[node.parent]
            parent.children.pop(self.child_key(node), None)
        elif kind == "alloc":
            taken = set(self._pages(g("slots", ())))
            self.free_pages = [p for p in self.free_pages if p not in taken]
            # an alloc is followed by a forward pass that writes the slots
            slots = list(g("slots", ()))
            if slots:
                self.written[slots] = True
        elif kind == "free":
            self.free_pages.extend(self._pages(g("slots", ())))
        elif kind in ("lock", "unlock"):
            step = 1 if kind == "lock" else -1
            for nid in g("path", ()) or ():
                self.nodes[int(nid)].lock_ref += step
        elif kind == "reset":
            root = _Node(0, None, [], [], t, t, lock_ref=1)
            self.nodes = {0: root}
            self.root_id = 0
            self.next_id = 1
            self.free_pages = list(range(1, self.num_slots // self.page_size + 1))
        self.seq = int(ev_get(e, "seq", self.seq))
        self.time = t

    # ----- views -----------------------------------------------------------------------------
    def _preorder(self) -> list[_Node]:
        out, stack = [], [self.nodes[self.root_id]]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(self.nodes[c] for c in reversed(list(n.children.values())))
        return out

    def _eviction_order(self, evictable: set) -> tuple[int, ...]:
        """The order RadixCache.eviction_order gives: heap of (policy key, id), parents join when
        their last child is popped (for a stateful policy, its LRU stand-in: see replay_note)."""
        fn = POLICIES.get(self.policy, POLICIES["lru"])
        heap = [(fn(self.nodes[i]), i) for i in evictable]
        heapq.heapify(heap)
        left: dict[int, int] = {}
        order = []
        while heap:
            _, nid = heapq.heappop(heap)
            order.append(nid)
            p = self.nodes[nid].parent
            if p == self.root_id or self.nodes[p].lock_ref > 0:
                continue
            left[p] = left.get(p, len(self.nodes[p].children)) - 1
            if left[p] == 0:
                heapq.heappush(heap, (fn(self.nodes[p]), p))
        return tuple(order)

    def snapshot(self) -> CacheSnapshot:
        nodes = self._preorder()
        evictable = {n.id for n in nodes if n.id != self.root_id and not n.children and n.lock_ref == 0}
        ev_size = sum(len(n.token_ids) for n in nodes if n.id != self.root_id and n.lock_ref == 0)
        pr_size = sum(len(n.token_ids) for n in nodes if n.id != self.root_id and n.lock_ref > 0)
        return CacheSnapshot(
            seq=self.seq, time=self.time, policy=self.policy, page_size=self.page_size, num_slots=self.num_slots,
            root_id=self.root_id, nodes=tuple(n.view(self.root_id, n.id in evictable) for n in nodes),
            free_pages=tuple(self.free_pages), evictable_size=ev_size, protected_size=pr_size,
            total_size=ev_size + pr_size, eviction_order=self._eviction_order(evictable))

    def pool(self, num_layers: int = 0) -> PoolView:
        """Slot states and tokens as of now (no K norms: the past KV is not kept). Slots neither free
        nor in the tree are held by running requests (in use)."""
        snap = self.snapshot()
        size = self.num_slots + self.page_size
        held = np.ones(size, dtype=bool)
        held[:self.page_size] = False
        held[list(snap.free_slots())] = False
        for n in snap.nodes:
            if n.slots:
                held[list(n.slots)] = False
        states = slot_states(snap, self.written, np.flatnonzero(held))
        return PoolView(num_layers=num_layers, num_slots=self.num_slots, page_size=self.page_size, states=states,
                        slot_tokens=self.slot_tokens.copy(), k_norms=None)


def _check_contiguous(initial_seq: int, events: list) -> None:
    if events:
        first = int(ev_get(events[0], "seq", initial_seq + 1))
        if first > initial_seq + 1:
            raise ValueError(f"events start at seq {first} but the initial state is at seq {initial_seq}: "
                             f"{first - initial_seq - 1} events are missing (the log ring dropped them); "
                             f"replay from a later snapshot")


def replay(initial: CacheSnapshot, events: Iterable[EventLike], upto_seq: Optional[int] = None) -> CacheSnapshot:
    """The cache after every event with seq <= `upto_seq` (all when None), starting from `initial`
    (events at or before initial.seq are skipped)."""
    evs = [e for e in events if int(ev_get(e, "seq", 0)) > initial.seq]
    _check_contiguous(initial.seq, evs)
    model = CacheModel(initial)
    for e in evs:
        if upto_seq is not None and int(ev_get(e, "seq", 0)) > upto_seq:
            break
        model.apply(e)
    return model.snapshot()


class Replayer:
    """Random access over history for a time-travel slider: `at(seq)` replays forward from the
    nearest checkpoint (one every `checkpoint_every` events), so sliding costs at most that many
    events per move."""

    def __init__(self, initial: CacheSnapshot, events: Iterable[EventLike], checkpoint_every: int = 500) -> None:
        self.initial = initial
        self.events = [e for e in events if int(ev_get(e, "seq", 0)) > initial.seq]
        _check_contiguous(initial.seq, self.events)
        self.seqs = [int(ev_get(e, "seq", 0)) for e in self.events]
        self.every = max(1, checkpoint_every)
        self._checkpoints: dict[int, CacheModel] = {}  # events applied -> model copy

    @property
    def first_seq(self) -> int:
        return self.initial.seq

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.seqs else self.initial.seq

    def _model_at(self, seq: int) -> CacheModel:
        import bisect
        import copy
        count = bisect.bisect_right(self.seqs, seq)          # events to apply
        base = (count // self.every) * self.every
        while base > 0 and base not in self._checkpoints:
            base -= self.every
        model = copy.deepcopy(self._checkpoints[base]) if base else CacheModel(self.initial)
        for i in range(base, count):
            model.apply(self.events[i])
            if (i + 1) % self.every == 0 and (i + 1) not in self._checkpoints:
                self._checkpoints[i + 1] = copy.deepcopy(model)
        return model

    def at(self, seq: int) -> CacheSnapshot:
        """The cache snapshot after every event with seq <= `seq`."""
        return self._model_at(seq).snapshot()

    def pool_at(self, seq: int, num_layers: int = 0) -> PoolView:
        """Slot states and tokens after every event with seq <= `seq` (k_norms None)."""
        return self._model_at(seq).pool(num_layers)

    def extend(self, events: Iterable[EventLike]) -> None:
        """Append later events (the checkpoints taken so far stay valid)."""
        for e in events:
            s = int(ev_get(e, "seq", 0))
            if s > self.last_seq:
                self.events.append(e)
                self.seqs.append(s)

    def events_between(self, after: int, upto: int) -> list:
        """Events with after < seq <= upto (to highlight what one step did)."""
        return [e for e, s in zip(self.events, self.seqs) if after < s <= upto]
