"""The radix tree's data: keys (token runs), nodes (an edge and its slots), match results, and the
logical clock the article's "time 3" counts with. `core/cache/radix_cache.py` is what operates on them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from core.cache import radix_kernels


class LogicalClock:
    """A step counter: the engine ticks it once per scheduler step ("time 3" in the article)."""

    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t

    def tick(self) -> int:
        self.t += 1
        return self.t


class RadixKey:
    """Token ids plus an optional namespace (`extra_key`: adapter or tenant); stored as numpy."""

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Union[Sequence[int], np.ndarray, torch.Tensor],
                 extra_key: Optional[str] = None) -> None:
        if type(token_ids) is np.ndarray and token_ids.dtype == np.int64 and token_ids.ndim == 1:
            self.token_ids = token_ids   # what np.asarray would return (no copy), without its cost
        else:
            if isinstance(token_ids, torch.Tensor):
                token_ids = token_ids.cpu().numpy()
            self.token_ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        self.extra_key = extra_key

    @classmethod
    def wrap(cls, token_ids: np.ndarray, extra_key: Optional[str]) -> "RadixKey":
        """A key around an array that is already 1-D int64 (a slice of another key): no conversion."""
        key = cls.__new__(cls)
        key.token_ids, key.extra_key = token_ids, extra_key
        return key

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    def __getitem__(self, s: slice) -> "RadixKey":
        ids = self.token_ids[s]
        return RadixKey.wrap(ids if ids.ndim else ids.reshape(1), self.extra_key)

    def __repr__(self) -> str:
        head = self.token_ids[:8].tolist()
        return f"RadixKey({head}{'...' if len(self) > 8 else ''}, extra_key={self.extra_key!r})"


class TreeNode:
    """One edge of the tree and the node below it: `key` tokens and the `value` slots holding them.

    Slots for the cache's own fields (faster to read and create); `__dict__` for what a stateful policy
    keeps on a node (its `ev_*` fields)."""

    __slots__ = ("id", "children", "parent", "key", "value", "lock_ref", "last_access_time", "creation_time",
                 "hit_count", "priority", "__dict__")

    def __init__(self, node_id: int, key: RadixKey, value: torch.Tensor, parent: Optional["TreeNode"],
                 now: float, priority: int = 0) -> None:
        self.id = node_id
        self.children: dict = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.priority = priority

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __lt__(self, other: "TreeNode") -> bool:  # heap tie-break: older node first
        return self.id < other.id

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, tokens={len(self.key)}, lock_ref={self.lock_ref})"


@dataclass(slots=True)
class MatchResult:
    indices: torch.Tensor   # slots of the longest cached prefix, in token order
    last_node: TreeNode     # the node where that prefix ends (lock it to keep the prefix)


def common_len(a: np.ndarray, b: np.ndarray, page_size: int, start: int = 0) -> int:
    """Length of the common prefix of the token runs `a` and `b[start:]` (int64), rounded down to whole
    pages; compiled, stopping at the first block that differs (core/cache/radix_kernels.py)."""
    m = radix_kernels.prefix_len(a, b, start)
    return m - m % page_size
