"""Stateful eviction policies over the radix tree (the hooks are in base.py, the shared bookkeeping in tracked.py).

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
- `lhd` (core/cache/eviction/lhd.py): Least Hit Density (Beckmann et al., NSDI'18): learns, online, the distribution of the
  ages at which nodes of each class are hit or evicted, and evicts the node whose expected hits
  per token per unit of time still to spend in the cache is lowest.

Time for these policies is *tokens inserted into the cache* (not the engine's clock), so ages are
measured against the pool's turnover and mean the same in the engine, the lab and any trace.
"""
from __future__ import annotations

import math

from core.cache.eviction.base import PolicyCache
from core.cache.eviction.tracked import Ghosts, Tracked
from core.cache.radix_node import TreeNode


class GDSF(Tracked):
    name = "gdsf"
    description = ("prefix-aware frequency with aging (GDSF / LFU-DA): hits through a node plus "
                   "the value of the last victim")

    def attach(self, cache: PolicyCache) -> None:
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


class TwoLists(Tracked):
    """Nodes in one of two lists (ev_list 1 or 2) with token counts, for ARC and S3-FIFO."""

    def attach(self, cache: PolicyCache) -> None:
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


class ARC(TwoLists):
    name = "arc"
    description = ("adaptive replacement (ARC) on tree nodes: recent-once vs hit-again lists, "
                   "the split tuned online by ghosts of evicted nodes")

    def attach(self, cache: PolicyCache) -> None:
        super().attach(cache)
        self.p = 0.0            # target tokens of T1
        self.b1, self.b2 = Ghosts(self.capacity), Ghosts(self.capacity)

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


class S3FIFO(TwoLists):
    name = "s3fifo"
    description = ("S3-FIFO admission filter: new nodes wait in a small FIFO (10 % of the pool) and "
                   "go first unless hit there or recently evicted (ghost)")
    SMALL = 0.10    # the paper's fixed share of the small queue

    def attach(self, cache: PolicyCache) -> None:
        super().attach(cache)
        self.ghost = Ghosts(self.capacity)

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

    def attach(self, cache: PolicyCache) -> None:
        super().attach(cache)
        self.L = 0.0
        self.w = [0.5, 0.5]                 # arc, gdsf
        self.expert = 0
        self.regret = [Ghosts(self.capacity), Ghosts(self.capacity)]

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
