"""Eviction policies: each is a priority key over a leaf; the heap evicts the lowest key first.

These mirror SGLang's eviction strategies (lru, lfu, fifo, mru, filo, priority, slru) so a
choice made here transfers to a real SGLang deployment.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from core.radix_cache import TreeNode

PolicyKey = Callable[["TreeNode"], tuple]

SLRU_PROTECTED_HITS = 2  # a node hit at least this often sits in the protected segment


def _lru(n: "TreeNode") -> tuple:
    return (n.last_access_time,)


def _lfu(n: "TreeNode") -> tuple:
    return (n.hit_count, n.last_access_time)


def _fifo(n: "TreeNode") -> tuple:
    return (n.creation_time,)


def _mru(n: "TreeNode") -> tuple:
    return (-n.last_access_time,)


def _filo(n: "TreeNode") -> tuple:
    return (-n.creation_time,)


def _priority(n: "TreeNode") -> tuple:
    return (n.priority, n.last_access_time)


def _slru(n: "TreeNode") -> tuple:
    # Probationary nodes (hit once) go before protected ones; LRU within each segment.
    return (1 if n.hit_count >= SLRU_PROTECTED_HITS else 0, n.last_access_time)


POLICIES: dict[str, PolicyKey] = {
    "lru": _lru, "lfu": _lfu, "fifo": _fifo, "mru": _mru,
    "filo": _filo, "priority": _priority, "slru": _slru,
}

DESCRIPTIONS: dict[str, str] = {
    "lru": "least recently used leaf first (SGLang's default)",
    "lfu": "fewest hits first, then least recently used",
    "fifo": "oldest inserted first",
    "mru": "most recently used first",
    "filo": "newest inserted first",
    "priority": "lowest request priority first, then least recently used",
    "slru": "segmented LRU: nodes hit twice or more are evicted after all others",
}


def get_policy(name: str) -> PolicyKey:
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown eviction policy {name!r}; choose one of: {', '.join(POLICIES)}") from None
