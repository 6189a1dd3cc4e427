"""The replay's RadixCache: the engine's own class, with an eviction callback and an evict that keeps its heap.

Used by the page-level replay only; the token-level replay runs the unmodified `RadixCache`, and
tests/lab/test_page_level.py holds the two equal on every policy, which is what checks this file.
"""
from __future__ import annotations

import heapq
from typing import Callable, Optional

import numpy as np
import torch

from core.radix_cache import RadixCache

# Policies whose key of a node never decreases while it stays in the tree (access times, hit counts and
# priorities only grow; creation times never change): a heap kept across evict calls stays valid for them.
MONOTONE_POLICIES = frozenset({"lru", "lfu", "fifo", "filo", "priority", "slru"})


class _EvictableLeaves(set):
    """`RadixCache.evictable_leaves`, which also pushes every leaf that becomes evictable onto a heap."""

    def __init__(self, cache: "LabCache") -> None:
        super().__init__()
        self.cache = cache

    def add(self, node) -> None:
        if node not in self:
            super().add(node)
            heapq.heappush(self.cache._lazy_heap, (self.cache.policy(node), node))


class LabCache(RadixCache):
    """The engine's RadixCache with two additions for the replay:

    - `on_evict(keys)`, called for every evicted leaf (the host tier's seam);
    - for policies in MONOTONE_POLICIES, `evict` keeps its heap from one call to the next instead of
      rebuilding it over every evictable leaf each time (the rebuild was the largest cost of a point).
      Entries are checked when popped: a node no longer evictable is skipped, a node whose key has grown
      since it was pushed goes back with its current key. Keys never shrink, so the smallest entry whose key
      is current is the smallest (key, node) among evictable leaves: exactly the leaf RadixCache.evict picks.
      The page-level replay uses it and the token-level replay (plain RadixCache) is held equal to it by
      tests/lab/test_replay.py on every policy.
    """

    on_evict: Optional[Callable[[np.ndarray], None]] = None
    evicted_nodes = 0

    def reset(self) -> None:
        self._lazy_heap: list = []
        super().reset()
        if self.policy_name in MONOTONE_POLICIES:
            leaves = _EvictableLeaves(self)
            for n in self.evictable_leaves:
                leaves.add(n)
            self.evictable_leaves = leaves

    def _delete_leaf(self, node, policy_key):
        if self.on_evict is not None:
            self.on_evict(node.key.token_ids)
        self.evicted_nodes += 1
        return super()._delete_leaf(node, policy_key)

    def evict(self, num_tokens: int) -> int:
        if not isinstance(self.evictable_leaves, _EvictableLeaves):
            return super().evict(num_tokens)
        if num_tokens <= 0:
            return 0
        heap, leaves, policy = self._lazy_heap, self.evictable_leaves, self.policy
        pop, push = heapq.heappop, heapq.heappush
        freed = 0
        allocator, batch = self.allocator, _FreeBatch()
        self.allocator = batch        # _delete_leaf frees into the batch: one allocator.free for the whole call
        try:
            while freed < num_tokens and heap:
                key, node = pop(heap)
                if node not in leaves:
                    continue                      # locked, no longer a leaf, or gone: its entry is stale
                now = policy(node)
                if now != key:
                    push(heap, (now, node))       # touched since it was pushed
                    continue
                freed += self._delete_leaf(node, key)   # a parent left childless is added (and pushed) here
        finally:
            self.allocator = allocator
            if batch.values:              # the same slots in the same order as one free per leaf
                allocator.free(batch.values[0] if len(batch.values) == 1 else torch.cat(batch.values))
        return freed


class _FreeBatch:
    """Stands in for the allocator during one evict: collects what _delete_leaf frees."""

    def __init__(self) -> None:
        self.values: list = []

    def free(self, value: torch.Tensor) -> None:
        self.values.append(value)
