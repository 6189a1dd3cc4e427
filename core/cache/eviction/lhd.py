"""`lhd`: Least Hit Density on the radix tree, learned online (Beckmann, Chen, Cidon, NSDI'18).

A node's worth is its *hit density*: the hits it can still expect per token per unit of time it
will go on occupying the pool. Both depend on its age (time since its last hit or insert) and
its class (how often it was hit since it came in); the policy learns them from what it sees:
for each class, how many tokens were hit and how many evicted at each age. From those
histograms, for a node of class c at age a (Beckmann's formula):

    density(c, a) = sum_{x >= a} hits_c(x) / sum_{x >= a} (hits_c(x) + evictions_c(x)) * (x - a + 1)

Histograms decay by half every time a pool's worth of tokens is inserted, so the policy follows
a workload that changes. With no history every density is 0 and the tie-break (least recently
used) decides: it starts out as LRU. Ages are measured in tokens inserted, in buckets of 1/32 of
the pool, up to 4 pools: no constant depends on a trace.

Cost: O(1) per hook; the density table (classes x buckets) is recomputed with numpy once per
1/4 pool of inserted tokens, amortised over every eviction of that period.
"""
from __future__ import annotations

import numpy as np

from core.cache.eviction.base import PolicyCache
from core.cache.eviction.tracked import Tracked
from core.cache.radix_node import TreeNode

HITS = 3             # hits since insert: 0, 1, 2+
SIZES = 24           # bit length of the tokens the node came in with (its request's new tokens)
CLASSES = HITS * SIZES
BUCKETS = 128        # age buckets of pool/32 tokens: ages up to 4 pools
PER_POOL = 32
DECAY = 0.5          # per pool of inserted tokens


class LHD(Tracked):
    name = "lhd"
    description = ("least hit density, learned online: evicts the leaf expected to earn the fewest "
                   "hits per token for the time it would still hold its slots")

    def attach(self, cache: PolicyCache) -> None:
        super().attach(cache)
        self.width = max(1, self.capacity // PER_POOL)
        self.hits = np.zeros((CLASSES, BUCKETS))
        self.evicts = np.zeros((CLASSES, BUCKETS))
        self.density = [[0.0] * BUCKETS for _ in range(CLASSES)]
        self.period = max(1, self.capacity // 4)
        self.next_update = self.period

    @staticmethod
    def ev_size_of(tokens: int) -> int:
        """First row of the size class of a node that came in with `tokens` tokens."""
        return min(int(tokens).bit_length(), SIZES - 1) * HITS

    def admit(self, node: "TreeNode") -> None:
        node.ev_size = self.ev_size_of(len(node.key))

    def split(self, head: "TreeNode", tail: "TreeNode") -> None:
        head.ev_size = tail.ev_size

    def _cell(self, node: "TreeNode") -> tuple[int, int]:
        age = (self.clock - node.ev_time) // self.width
        return node.ev_size + min(node.ev_hits, HITS - 1), age if age < BUCKETS else BUCKETS - 1

    def hit(self, node: "TreeNode") -> None:
        c, b = self._cell(node)
        self.hits[c, b] += len(node.key)

    def on_evict(self, node: "TreeNode") -> None:
        c, b = self._cell(node)
        self.evicts[c, b] += len(node.key)

    def key(self, node: "TreeNode") -> tuple:
        age = (self.clock - node.ev_time) // self.width
        row = self.density[node.ev_size + (node.ev_hits if node.ev_hits < HITS else HITS - 1)]
        return (row[age] if age < BUCKETS else row[-1], node.last_access_time)

    def on_insert(self, node: "TreeNode", now: float) -> None:
        super().on_insert(node, now)
        if self.clock >= self.next_update:    # on insert, not in begin_evict: a snapshot's
            self._update()                    # eviction_order must not move the learning on

    def _update(self) -> None:
        """Recompute the density table from the histograms, then decay them."""
        self.next_update = self.clock + self.period
        ages = np.arange(BUCKETS, dtype=np.float64)
        ev = self.hits + self.evicts
        rev = lambda a: np.cumsum(a[:, ::-1], axis=1)[:, ::-1]   # sum over x >= a
        hits_above = rev(self.hits)
        s1, s2 = rev(ev), rev(ev * ages)
        life = s2 - (ages - 1.0) * s1                            # sum (x - a + 1) * events(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            dens = np.where(life > 0, hits_above / life, 0.0)
        self.density = dens.tolist()
        f = DECAY ** (self.period / self.capacity)
        self.hits *= f
        self.evicts *= f
