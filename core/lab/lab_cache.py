"""The replay's RadixCache: the engine's own class, with an eviction callback and one free per evict call.

Used by the page-level replay only; the token-level replay runs the unmodified `RadixCache`, and
tests/lab/test_page_level.py holds the two equal on every policy, which is what checks this file.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from core.cache.radix_cache import RadixCache


class LabCache(RadixCache):
    """The engine's RadixCache with two additions for the replay:

    - `on_evict(keys)`, called for every evicted leaf (the host tier's seam);
    - `evict` hands the allocator one free for the whole call (the same slots in the same order as one
      free per leaf), so a point's many small evictions cost one allocator call each.
    """

    on_evict: Optional[Callable[[np.ndarray], None]] = None

    def _delete_leaf(self, node, policy_key):
        if self.on_evict is not None:
            self.on_evict(node.key.token_ids)
        return super()._delete_leaf(node, policy_key)

    def evict(self, num_tokens: int) -> int:
        allocator, batch = self.allocator, _FreeBatch()
        self.allocator = batch        # _delete_leaf frees into the batch
        try:
            return super().evict(num_tokens)
        finally:
            self.allocator = allocator
            if batch.values:
                allocator.free(batch.values[0] if len(batch.values) == 1 else torch.cat(batch.values))


class _FreeBatch:
    """Stands in for the allocator during one evict: collects what _delete_leaf frees."""

    def __init__(self) -> None:
        self.values: list = []

    def free(self, value: torch.Tensor) -> None:
        self.values.append(value)
