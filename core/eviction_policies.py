"""Stateful eviction policies over the radix tree (the hooks are in core/eviction.py).

All of them obey the tree's rules (the cache only ever asks them to rank unlocked leaves; a
parent becomes a candidate once its last child is gone) and all of them rank per token: a leaf of
s tokens frees s slots and a hit through it saves s tokens of prefill, so size cancels out.

- `gdsf`: prefix-aware frequency with aging (GreedyDual-Size-Frequency / LFU-DA): value =
  L + hits through the node, where every request matching *through* a node (to any descendant)
  counts, and L is the value of the last victim, so old counts age out without a constant.
- `arc`: ARC (Megiddo & Modha) on tree nodes: T1 = not hit since it came in, T2 = hit; ghost
  lists of evicted nodes move the T1 target p online, so there is no constant to tune.
- `s3fifo`: S3-FIFO's admission filter (Yang et al., SOSP'23): a new node sits in a small
  FIFO (10 % of the pool) and leaves first unless it is hit there or its prefix was evicted
  recently (ghost), so a one-hit prefix cannot push out a hot system prompt.
- `lecar`: LeCaR (Vietri et al., HotStorage'18) over two experts, `arc` and `gdsf`, weighted online by
  the regret of each one's victims.
- `lhd` (core/eviction_lhd.py): Least Hit Density (Beckmann et al., NSDI'18): learns, online, the distribution of the
  ages at which nodes of each class are hit or evicted, and evicts the node whose expected hits
  per token per unit of time still to spend in the cache is lowest.

Time for these policies is *tokens inserted into the cache* (not the engine's clock), so ages are
measured against the pool's turnover and mean the same in the engine, the lab and any trace.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

from core.eviction import EvictionPolicy, register

if TYPE_CHECKING:
    from core.radix_cache import RadixCache, TreeNode


class _Tracked(EvictionPolicy):
    """Per-node bookkeeping every stateful policy shares, stored as attributes on the node:

    ev_hits: requests that matched through the node since it entered the cache (one per tick);
    ev_tick: the cache tick of its last counted event (dedups the replay's and scheduler's
             re-match right after an insert, which is the same request, not a new hit);
    ev_start: tokens above the node (its depth), which with its first tokens names it in ghosts;
    ev_time: the policy clock (tokens inserted so far) at its last hit or insert.
    """

    stateful = True

    def attach(self, cache: "RadixCache") -> None:
        super().attach(cache)
        self.clock = 0          # tokens inserted so far: the policy's notion of time

    def on_insert(self, node: "TreeNode", now: float) -> None:
        parent = node.parent
        node.ev_start = getattr(parent, "ev_start", 0) + len(parent.key)
        node.ev_hits = 0
        node.ev_tick = now
        self.clock += len(node.key)
        node.ev_time = self.clock
        self.admit(node)

    def on_match(self, path: Sequence["TreeNode"], now: float) -> None:
        for n in path:
            if n.ev_tick != now:
                n.ev_tick = now
                self.hit(n)
                n.ev_hits += 1
                n.ev_time = self.clock

    def on_split(self, head: "TreeNode", tail: "TreeNode") -> None:
        head.ev_start, head.ev_hits, head.ev_tick, head.ev_time = tail.ev_start, tail.ev_hits, tail.ev_tick, tail.ev_time
        tail.ev_start += len(head.key)
        self.split(head, tail)

    @staticmethod
    def ident(node: "TreeNode") -> tuple:
        """A node's name that survives its eviction: depth, first tokens, namespace."""
        return (node.ev_start, node.key.token_ids[:4].tobytes(), node.key.extra_key)

    # subclasses override what they need
    def admit(self, node: "TreeNode") -> None: ...
    def hit(self, node: "TreeNode") -> None: ...
    def split(self, head: "TreeNode", tail: "TreeNode") -> None: ...


class _Ghosts:
    """Names of recently evicted nodes with their sizes, oldest dropped past `limit` tokens."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size, self.d = limit, 0, OrderedDict()

    def add(self, name: tuple, size: int, info: object = True) -> None:
        old = self.d.pop(name, None)
        if old is not None:
            self.size -= old[0]
        self.d[name] = (size, info)
        self.size += size
        while self.size > self.limit and self.d:
            self.size -= self.d.popitem(last=False)[1][0]

    def pop(self, name: tuple):
        """The `info` stored with `name` (removing it), or None when it is not remembered."""
        got = self.d.pop(name, None)
        if got is None:
            return None
        self.size -= got[0]
        return got[1]


@register
class GDSF(_Tracked):
    name = "gdsf"
    description = ("prefix-aware frequency with aging (GDSF / LFU-DA): hits through a node plus "
                   "the value of the last victim")

    def attach(self, cache: "RadixCache") -> None:
        super().attach(cache)
        self.L = 0.0

    def admit(self, node: "TreeNode") -> None:
        node.ev_h = self.L

    def hit(self, node: "TreeNode") -> None:
        node.ev_h = self.L + node.ev_hits + 1

    def split(self, head: "TreeNode", tail: "TreeNode") -> None:
        head.ev_h = tail.ev_h

    def key(self, node: "TreeNode") -> tuple:
        return (node.ev_h, node.last_access_time)

    def on_evict(self, node: "TreeNode") -> None:
        self.L = max(self.L, node.ev_h)


class _TwoLists(_Tracked):
    """Nodes in one of two lists (ev_list 1 or 2) with token counts, for ARC and S3-FIFO."""

    def attach(self, cache: "RadixCache") -> None:
        super().attach(cache)
        self.size = {1: 0, 2: 0}
        self.first = 1

    def _move(self, node: "TreeNode", to: int) -> None:
        self.size[node.ev_list] -= len(node.key)
        node.ev_list = to
        self.size[to] += len(node.key)

    def split(self, head: "TreeNode", tail: "TreeNode") -> None:
        head.ev_list = tail.ev_list     # sizes unchanged: the tokens stay in the same list

    def key(self, node: "TreeNode") -> tuple:
        return (node.ev_list != self.first, node.last_access_time)


@register
class ARC(_TwoLists):
    name = "arc"
    description = ("adaptive replacement (ARC) on tree nodes: recent-once vs hit-again lists, "
                   "the split tuned online by ghosts of evicted nodes")

    def attach(self, cache: "RadixCache") -> None:
        super().attach(cache)
        self.p = 0.0            # target tokens of T1
        self.b1, self.b2 = _Ghosts(self.capacity), _Ghosts(self.capacity)

    def admit(self, node: "TreeNode") -> None:
        name, size = self.ident(node), len(node.key)
        node.ev_list = 1
        if self.b1.pop(name):       # evicted too early from T1: give T1 more room
            self.p = min(self.capacity, self.p + size * max(1.0, self.b2.size / max(self.b1.size, 1)))
            node.ev_list = 2
        elif self.b2.pop(name):     # evicted too early from T2: give T2 more room
            self.p = max(0.0, self.p - size * max(1.0, self.b1.size / max(self.b2.size, 1)))
            node.ev_list = 2
        self.size[node.ev_list] += size

    def hit(self, node: "TreeNode") -> None:
        if node.ev_list == 1:
            self._move(node, 2)

    def begin_evict(self) -> None:
        self.first = 1 if self.size[1] > self.p else 2

    def on_evict(self, node: "TreeNode") -> None:
        self.size[node.ev_list] -= len(node.key)
        (self.b1 if node.ev_list == 1 else self.b2).add(self.ident(node), len(node.key))


@register
class S3FIFO(_TwoLists):
    name = "s3fifo"
    description = ("S3-FIFO admission filter: new nodes wait in a small FIFO (10 % of the pool) and "
                   "go first unless hit there or recently evicted (ghost)")
    SMALL = 0.10    # the paper's fixed share of the small queue

    def attach(self, cache: "RadixCache") -> None:
        super().attach(cache)
        self.ghost = _Ghosts(self.capacity)

    def admit(self, node: "TreeNode") -> None:
        node.ev_list = 2 if self.ghost.pop(self.ident(node)) else 1
        self.size[node.ev_list] += len(node.key)

    def hit(self, node: "TreeNode") -> None:
        if node.ev_list == 1:
            self._move(node, 2)

    def begin_evict(self) -> None:
        self.first = 1 if self.size[1] > self.SMALL * self.capacity else 2

    def key(self, node: "TreeNode") -> tuple:
        # small queue: FIFO by insertion; main: least recently used
        return (node.ev_list != self.first, node.ev_time if node.ev_list == 1 else node.last_access_time)

    def on_evict(self, node: "TreeNode") -> None:
        self.size[node.ev_list] -= len(node.key)
        if node.ev_list == 1:
            self.ghost.add(self.ident(node), len(node.key))


@register
class LeCaR(ARC):
    """LeCaR (Vietri et al., HotStorage'18) with two experts: `arc` (recency, self-tuned) and `gdsf`
    (frequency with aging). Each `evict` call follows the expert with the larger weight; a victim is
    remembered in the ghost of the expert that chose it, and when it is asked for again that expert's
    weight drops by exp(-0.45 * 0.005 ** (age / pool)), the paper's learning rate and discount with age
    measured in pools of inserted tokens. Deterministic: the larger weight wins, ties go to arc."""

    name = "lecar"
    description = ("learns online which expert to follow, arc (recency) or gdsf (frequency with aging), "
                   "from the ghosts of each one's victims (LeCaR)")
    RATE, DISCOUNT = 0.45, 0.005

    def attach(self, cache: "RadixCache") -> None:
        super().attach(cache)
        self.L = 0.0
        self.w = [0.5, 0.5]                 # arc, gdsf
        self.expert = 0
        self.regret = [_Ghosts(self.capacity), _Ghosts(self.capacity)]

    def admit(self, node: "TreeNode") -> None:
        name = self.ident(node)
        for e, ghost in enumerate(self.regret):
            when = ghost.pop(name)
            if when is not None:
                age = (self.clock - when) / self.capacity
                self.w[e] *= math.exp(-self.RATE * self.DISCOUNT ** age)
                total = self.w[0] + self.w[1]
                self.w = [self.w[0] / total, self.w[1] / total]
        super().admit(node)
        node.ev_h = self.L

    def hit(self, node: "TreeNode") -> None:
        super().hit(node)
        node.ev_h = self.L + node.ev_hits + 1

    def split(self, head: "TreeNode", tail: "TreeNode") -> None:
        super().split(head, tail)
        head.ev_h = tail.ev_h

    def begin_evict(self) -> None:
        super().begin_evict()
        self.expert = 1 if self.w[1] > self.w[0] else 0

    def key(self, node: "TreeNode") -> tuple:
        if self.expert:
            return (node.ev_h, node.last_access_time)
        return (node.ev_list != self.first, node.last_access_time)

    def on_evict(self, node: "TreeNode") -> None:
        super().on_evict(node)
        self.L = max(self.L, node.ev_h)
        self.regret[self.expert].add(self.ident(node), len(node.key), self.clock)
