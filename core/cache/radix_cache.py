"""The radix tree of cached prefixes: edges hold token runs, nodes hold the slots of those tokens.

Follows SGLang's `radix_cache.py` (names included): `match_prefix` walks down and splits the
node where the match stops, `insert` hangs the unmatched rest underneath, `evict` pops the
lowest-priority unlocked leaf off a heap until enough slots are free, and `inc_lock_ref` /
`dec_lock_ref` protect the paths running requests depend on. Eviction itself (the heaps, partial
leaves, `eviction_order`) is in core/cache/radix_evict.py.
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

import numpy as np
import torch

from core.cache import events as ev
from core.cache import radix_kernels
from core.cache.allocator import SLOT_DTYPE, SlotAllocator
from core.cache.eviction.registry import make_policy
from core.cache.radix_evict import EvictionMixin
from core.cache.radix_node import LogicalClock, MatchResult, RadixKey, TreeNode, common_len

__all__ = ["LogicalClock", "MatchResult", "RadixCache", "RadixKey", "TreeNode"]


def _as_slots(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A caller's slot tensor in the tree's dtype and device; ids that dtype cannot hold are refused, not
    wrapped into some other slot."""
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype is torch.bool:
        raise ValueError(f"insert needs integer slot ids, got a {value.dtype} tensor")
    if value.dim() != 1:
        raise ValueError(f"insert needs a 1-D slot tensor, one slot per token, got shape {tuple(value.shape)}")
    if value.numel() and (int(value.min()) < 0 or int(value.max()) > torch.iinfo(SLOT_DTYPE).max):
        raise ValueError(f"insert got slot ids outside 0..{torch.iinfo(SLOT_DTYPE).max} "
                         f"(min {int(value.min())}, max {int(value.max())}): pass the slots alloc() handed out")
    return value.to(device=device, dtype=SLOT_DTYPE)


def _check_output_len(output_len: object) -> int:
    if isinstance(output_len, bool) or not isinstance(output_len, (int, np.integer)) or output_len < 0:
        raise ValueError(f"output_len must be a non-negative integer (tokens the request generated), "
                         f"got {output_len!r}")
    return int(output_len)


class RadixCache(EvictionMixin):
    def __init__(self, allocator: SlotAllocator, page_size: int = 1, eviction_policy: str = "lru",
                 clock: Optional[Callable[[], float]] = None, disable: bool = False,
                 record_events: bool = True, event_capacity: int = 100_000) -> None:
        if page_size != allocator.page_size:
            raise ValueError(f"page_size={page_size} differs from the allocator's page_size="
                             f"{allocator.page_size}; pass the same value to both")
        self.allocator = allocator
        self.page_size = page_size
        self.policy_name = eviction_policy
        self.policy = make_policy(eviction_policy)  # policy hooks: marked `# policy hook` below
        self.logical_clock = LogicalClock()
        self.clock: Callable[[], float] = clock if clock is not None else self.logical_clock
        self.disable = disable
        self.events = ev.EventLog(event_capacity, enabled=record_events)
        allocator.on_event = self._on_alloc_event
        self.device = allocator.device
        self._empty = torch.empty(0, dtype=SLOT_DTYPE, device=self.device)
        radix_kernels.load()  # the walk's compiled compare, loaded now rather than in the first match_prefix
        self.reset()

    # ----- bookkeeping -------------------------------------------------------------------
    def reset(self) -> None:
        """Drop the whole tree and give every slot back. Refused while a path is locked: the request holding
        it reads those slots, and they would be handed out again."""
        locked = getattr(self, "_protected_size", 0)
        if locked:
            raise ValueError(f"reset with {locked} tokens locked by running requests: their slots would be handed "
                             f"out again; release them (dec_lock_ref) or wait for them first")
        self._next_id = itertools.count()
        self.root_node = TreeNode(next(self._next_id), RadixKey([]), self._empty, None, self.clock())
        self.root_node.lock_ref = 1  # the root is never evicted
        self.evictable_leaves: set[TreeNode] = set()
        # monotone key policies: one heap kept across evict calls (None: rebuilt per call, as SGLang does)
        self._lazy_heap: Optional[list] = [] if self.policy.monotone else None
        self._evictable_size = 0
        self._protected_size = 0
        self.evicted_tokens = 0  # cumulative, for the engine's metrics
        self.evicted_nodes = 0   # leaves evicted (one evict event each), likewise
        self.policy.attach(self)  # policy hook: a stateful policy starts afresh
        self.allocator.clear()
        self.events.append(ev.ResetEvent, self.clock())

    def _on_alloc_event(self, kind: str, slots: torch.Tensor) -> None:
        if self.events.enabled:
            self.events.append(ev.AllocEvent if kind == "alloc" else ev.FreeEvent, self.clock(),
                               slots=tuple(slots.tolist()))

    def tick(self) -> float:
        """Advance the default logical clock (no effect on an injected clock)."""
        return self.logical_clock.tick()

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def child_key(self, key: RadixKey):
        """The key a node with edge `key` has in its parent's children dict (its first token, or page)."""
        return self._edge_key(key.token_ids, 0, key.extra_key)

    def _edge_key(self, ids: np.ndarray, pos: int, extra_key: Optional[str]):
        """The children-dict key of an edge starting at ids[pos]: its first token (first page)."""
        first = ids.item(pos) if self.page_size == 1 else tuple(ids[pos:pos + self.page_size].tolist())
        return first if extra_key is None else (extra_key, first)

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node is not self.root_node and node.is_leaf and node.lock_ref == 0:
            if node not in self.evictable_leaves:
                self.evictable_leaves.add(node)
                if self._lazy_heap is not None:
                    self._push_lazy(node)
        else:
            self.evictable_leaves.discard(node)

    def _path(self, node: TreeNode) -> tuple[int, ...]:
        ids = []
        while node is not None and node is not self.root_node:
            ids.append(node.id)
            node = node.parent
        return tuple(reversed(ids))

    # ----- match ---------------------------------------------------------------------------
    def match_prefix(self, key: RadixKey) -> MatchResult:
        """Longest cached prefix of `key`; splits the node where the match ends mid-edge."""
        size = key.token_ids.shape[0]
        if self.disable or size < self.page_size:
            return MatchResult(self._empty, self.root_node)
        if size % self.page_size:
            key = key[:self._aligned(size)]
        now = self.clock()
        path, pos = self._walk(key, now)
        self.policy.on_match(path, now)  # policy hook (hit_count is counted by insert, as SGLang does)
        node = path[-1] if path else self.root_node
        indices = torch.cat([n.value for n in path]) if path else self._empty
        if self.events.enabled:
            self.events.append(ev.MatchEvent, now, tokens_asked=len(key), tokens_hit=pos,
                               path=self._path(node), extra_key=key.extra_key)
        return MatchResult(indices, node)

    def _walk(self, key: RadixKey, now: float) -> tuple[list[TreeNode], int]:
        """Follow `key` down from the root, stamping `now` on every node visited; where the match
        ends mid-edge, split that edge. Returns the matched nodes in order and the tokens matched."""
        node = self.root_node
        node.last_access_time = now
        path: list[TreeNode] = []
        pos, ids, extra, ps = 0, key.token_ids, key.extra_key, self.page_size
        size = ids.shape[0]
        while pos < size:
            child = node.children.get(self._edge_key(ids, pos, extra))
            if child is None:
                break
            child.last_access_time = now
            n = common_len(child.key.token_ids, ids, ps, pos)
            if n < child.key.token_ids.shape[0]:
                child = self._split_node(child, n, now)
                path.append(child)
                pos += n
                break
            path.append(child)
            pos += n
            node = child
        return path, pos

    def peek_prefix_len(self, key: RadixKey) -> int:
        """Cached prefix length of `key` without splitting, stamping or counting a hit: the
        scheduler orders its waiting queue by it (lpm) before it matches for real."""
        if self.disable:
            return 0
        node, pos, ids = self.root_node, 0, key.token_ids
        while len(ids) - pos >= self.page_size:
            child = node.children.get(self._edge_key(ids, pos, key.extra_key))
            if child is None:
                break
            n = common_len(child.key.token_ids, ids, self.page_size, pos)
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def _split_node(self, child: TreeNode, split_len: int, now: float) -> TreeNode:
        """Cut `child`'s edge after `split_len` tokens; the new node takes the prefix and becomes the parent.

        Both halves are stamped `now`: as in the article, the split-off leaf counts as touched. The new node is
        created `now` (fifo / filo see it as new, as in SGLang) and carries the child's hits and locks.
        """
        parent = child.parent
        new_node = TreeNode(next(self._next_id), child.key[:split_len], child.value[:split_len], parent,
                            now, child.priority)
        new_node.hit_count = child.hit_count
        new_node.lock_ref = child.lock_ref
        parent.children[self.child_key(child.key)] = new_node
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        child.parent = new_node
        child.last_access_time = now
        new_node.children[self.child_key(child.key)] = child
        self.policy.on_split(new_node, child)  # policy hook
        if self.events.enabled:
            self.events.append(ev.SplitEvent, now, node=child.id, new_parent=new_node.id, position=split_len)
        return new_node

    # ----- insert --------------------------------------------------------------------------
    def insert(self, key: RadixKey, value: torch.Tensor, priority: int = 0,
               output_len: Optional[int] = None, inserted_len: int = 0) -> int:
        """Cache `key` with its slots `value`; returns how many leading tokens were already cached.

        Only whole pages are inserted: with `aligned` = len(key) rounded down to a page, `value[:returned]`
        duplicates what the tree holds (the caller frees the part it allocated itself), the tree owns
        `value[returned:aligned]` from now on, and `value[aligned:]` (a partial page) stays the caller's to
        free. The tree keeps its part without a copy when that is most of `value`'s memory (a short tail is
        copied, so it does not pin the whole tensor): never write into `value` afterwards.
        `inserted_len`: how many leading tokens this request inserted before (SGLang's cache_inserted_len):
        each node ending past it counts one hit, so a request counts once on every node of its path however
        many chunks it inserts in (`hit_count`, which lfu and slru rank by).
        `output_len`: given by cache_finished_req, the tokens the request generated; the policy hears it
        with the deepest node of `key` (`request_finished`).
        """
        if output_len is not None:
            output_len = _check_output_len(output_len)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"insert needs the slots as a 1-D torch tensor (what alloc() returns), got "
                             f"{type(value).__name__}")
        size = key.token_ids.shape[0]
        if size != value.numel():
            raise ValueError(f"insert: key has {size} tokens but value has {value.numel()} slots; "
                             f"pass one slot per token")
        if self.disable:
            return 0
        if size % self.page_size:
            size = self._aligned(size)
            key, value = key[:size], value[:size]
        if value.dtype is not SLOT_DTYPE or value.device != self.device or value.dim() != 1:
            value = _as_slots(value, self.device)
        now = self.clock()
        path, pos = self._walk(key, now)
        for n in path:
            n.priority = max(n.priority, priority)
        counted = self._count_hits(path, inserted_len)
        node = path[-1] if path else self.root_node
        if pos < size:
            if pos:
                key, value = key[pos:], value[pos:]
            else:
                key = RadixKey.wrap(key.token_ids, key.extra_key)   # the tree's own key object, no copy
            node = self._add_leaf(node, key, value, now, priority, counted, hit=size > inserted_len)
        elif self.events.enabled:  # nothing added, but the path was stamped: record the touch
            self.events.append(ev.TouchEvent, now, node=node.id, path=self._path(node), counted=counted)
        if output_len is not None:
            self.request_finished(node, output_len)
        return pos

    def request_finished(self, node: TreeNode, output_len: int) -> None:
        """A request whose tokens end at `node` (in the tree) finished having generated `output_len`
        tokens: told to the policy (`on_finish`), which may class the request's pages by it. The
        scheduler calls it directly when the finish inserted nothing new (`insert(output_len=)` else)."""
        output_len = _check_output_len(output_len)
        if not isinstance(node, TreeNode):
            raise ValueError(f"request_finished needs the request's TreeNode (its last_node), got "
                             f"{type(node).__name__}")
        if node is self.root_node:      # the request cached nothing (a disabled cache holds only the root)
            return
        if node.parent is None:
            raise ValueError(f"request_finished on node {node.id}, which is no longer in the tree")
        self.policy.on_finish(node, output_len)  # policy hook

    @staticmethod
    def _count_hits(path: list[TreeNode], inserted_len: int) -> tuple[int, ...]:
        """One hit on each node of an insert's walked `path` that ends past `inserted_len` (SGLang's
        _insert_helper); returns the ids counted (for the event)."""
        counted, end = [], 0
        for n in path:
            end += n.key.token_ids.shape[0]
            if end > inserted_len:
                n.hit_count += 1
                counted.append(n.id)
        return tuple(counted)

    def _add_leaf(self, parent: TreeNode, key: RadixKey, value: torch.Tensor, now: float, priority: int,
                  counted: tuple[int, ...] = (), hit: bool = True) -> TreeNode:
        """A new leaf under `parent`; `hit`: it ends past what its request inserted before, so counts a hit."""
        ids = key.token_ids
        size = ids.shape[0]
        if value.untyped_storage().nbytes() > 2 * value.element_size() * size:
            value = value.clone()  # a short tail of a long tensor: keeping the view would pin all of it
        new_node = TreeNode(next(self._next_id), key, value, parent, now, priority)
        new_node.hit_count = int(hit)
        parent.children[self.child_key(key)] = new_node
        self._evictable_size += size
        self.evictable_leaves.discard(parent)
        self._update_leaf_status(new_node)
        self.policy.on_insert(new_node, now)  # policy hook
        if self.events.enabled:
            self.events.append(ev.InsertEvent, now, node=new_node.id, parent=parent.id,
                               token_ids=tuple(key.token_ids.tolist()), slots=tuple(value.tolist()),
                               extra_key=key.extra_key, counted=counted + (new_node.id,) * hit)
        return new_node

    # ----- locks ---------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> int:
        """Protect root..node from eviction (a running request reads these slots). Returns the tokens that moved
        from evictable to protected (>= 0; SGLang's returns the same number negated, as a size delta)."""
        walk = node
        while walk is not self.root_node:  # validate first: a stale node must not touch the counters
            if walk.parent is None:
                raise ValueError(f"inc_lock_ref on node {node.id}, which is no longer in the tree (evicted "
                                 f"or from before a reset); call match_prefix again and lock its last_node")
            walk = walk.parent
        changed = 0
        last = node
        while node is not self.root_node:
            if node.lock_ref == 0:
                size = len(node.key)
                self._evictable_size -= size
                self._protected_size += size
                changed += size
            node.lock_ref += 1
            self.evictable_leaves.discard(node)
            node = node.parent
        if self.events.enabled and last is not self.root_node:
            self.events.append(ev.LockEvent, self.clock(), node=last.id, path=self._path(last))
        return changed

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Release a lock taken with `inc_lock_ref(node)`; raises (changing nothing) if there is none. Returns the
        tokens that moved from protected back to evictable (>= 0, as SGLang's)."""
        walk = node
        while walk is not self.root_node:
            if walk.lock_ref <= 0:
                raise ValueError(f"dec_lock_ref on node {walk.id} whose lock_ref is already 0: "
                                 f"every dec_lock_ref needs an earlier inc_lock_ref on the same node")
            if walk.parent is None:
                raise ValueError(f"dec_lock_ref on node {walk.id}, which is no longer in the tree")
            walk = walk.parent
        changed = 0
        last = node
        while node is not self.root_node:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                size = len(node.key)
                self._evictable_size += size
                self._protected_size -= size
                changed += size
            self._update_leaf_status(node)
            node = node.parent
        if self.events.enabled and last is not self.root_node:
            self.events.append(ev.UnlockEvent, self.clock(), node=last.id, path=self._path(last))
        return changed

    # ----- views ---------------------------------------------------------------------------
    def nodes(self) -> list[TreeNode]:
        """Every node, root first, parents before children."""
        out, stack = [], [self.root_node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(list(n.children.values())))
        return out
