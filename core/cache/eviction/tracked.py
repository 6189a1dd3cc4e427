"""What every stateful policy shares: per-node bookkeeping (`Tracked`) and a bounded memory of
evicted names (`Ghosts`). Time is tokens inserted into the cache, so ages mean the same in the
engine, the lab and any trace."""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from core.cache.eviction.base import EvictionPolicy, PolicyCache
from core.cache.radix_node import TreeNode


class Tracked(EvictionPolicy):
    """Per-node bookkeeping every stateful policy shares, stored as attributes on the node:

    ev_hits: requests that matched through the node since it entered the cache (one per tick);
    ev_tick: the cache tick of its last counted event (dedups the replay's and scheduler's
             re-match right after an insert, which is the same request, not a new hit);
    ev_start: tokens above the node (its depth), which with its first tokens names it in ghosts;
    ev_time: the policy clock (tokens inserted so far) at its last hit or insert.
    """

    stateful = True

    def attach(self, cache: PolicyCache) -> None:
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


class Ghosts:
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
