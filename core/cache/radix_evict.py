"""Eviction from the radix tree: the unlocked leaf with the lowest policy key goes first, off a heap.

`RadixCache` inherits this; it owns the tree (`evictable_leaves`, `_split_node`, `_update_leaf_status`)
and calls `_push_lazy` when a leaf becomes evictable. Two heaps, one rule:
- the monotone key policies (lru, lfu, fifo, filo, priority, slru: a node's key only grows while it is in
  the tree) keep one heap across evict calls, O(log n) a victim;
- every other policy (mru and the stateful ones) keys every evictable leaf per call, as
  SGLang does, since its keys can fall or depend on a per-call choice (`begin_evict`).
A policy may free only a leaf's tail pages (`evict_tail`): the leaf is split and its head stays.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Optional

from core.cache import events as ev

if TYPE_CHECKING:
    from core.cache.radix_node import TreeNode


class EvictionMixin:
    """`evict`, `eviction_order` and their heaps, for `RadixCache`."""

    def _push_lazy(self, node: TreeNode) -> None:
        """A leaf became evictable: onto the kept heap. Entries of nodes locked or gone since stay until
        popped; when they outnumber the live ones the heap is rebuilt (amortised O(1) a push, bounded)."""
        heap = self._lazy_heap
        heapq.heappush(heap, (self.policy.key(node), node))
        if len(heap) > 2 * len(self.evictable_leaves) + 64:
            key = self.policy.key
            heap[:] = [(key(n), n) for n in self.evictable_leaves]
            heapq.heapify(heap)

    def _heap(self) -> list:
        self.policy.begin_evict()  # policy hook
        key = self.policy.key
        return [(key(n), n) for n in self.evictable_leaves]

    def evict(self, num_tokens: int) -> int:
        """Free unlocked leaves, lowest policy key first, until `num_tokens` are freed.

        A policy may ask for a leaf's tail pages only (`evict_tail`): the leaf is split there, the tail
        freed, and the head (still an unlocked leaf) goes back on the heap under its new key.
        """
        if num_tokens <= 0:
            return 0
        if self._lazy_heap is not None:
            return self._evict_lazy(num_tokens)
        heap = self._heap()
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            key, node = heapq.heappop(heap)
            if node.lock_ref > 0 or not node.is_leaf:
                continue
            tail = self._tail_tokens(node, num_tokens - freed)
            if tail < len(node.key):    # partial-leaf eviction: free the tail pages, keep the head
                head = self._split_node(node, len(node.key) - tail, node.last_access_time)
                freed += self._delete_leaf(node, key)
                heapq.heappush(heap, (self.policy(head), head))
                continue
            parent = node.parent
            freed += self._delete_leaf(node, key)
            if parent is not self.root_node and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (self.policy(parent), parent))
        return freed

    def _evict_lazy(self, num_tokens: int) -> int:
        """`evict` for a monotone key policy: pop the kept heap, O(log n) a victim instead of keying every
        evictable leaf each call. A popped entry of a node no longer evictable is dropped; one whose key has
        grown since its push goes back with its current key. Keys never shrink, so the first entry popped
        whose key is current is the smallest (key, node) among evictable leaves: the leaf the rebuild picks.
        Key policies free whole leaves, so no tail split here."""
        heap, leaves, key_of = self._lazy_heap, self.evictable_leaves, self.policy.key
        pop, push = heapq.heappop, heapq.heappush
        freed = 0
        while freed < num_tokens and heap:
            key, node = pop(heap)
            if node not in leaves:
                continue                      # locked, no longer a leaf, or gone: a stale entry
            now = key_of(node)
            if now != key:
                push(heap, (now, node))       # touched since it was pushed
                continue
            freed += self._delete_leaf(node, key)   # a parent left childless is pushed by _update_leaf_status
        return freed

    def _tail_tokens(self, node: TreeNode, need: int) -> int:
        """How many of leaf `node`'s last tokens to free: the policy's choice; a part of the leaf is whole
        pages, at least one, and no more than the `need` still to free (rounded up to a page)."""
        tail = self.policy.evict_tail(node)  # policy hook
        size = len(node.key)
        if tail >= size:
            return size
        tail = min(int(tail), need)
        return min(size, max(self.page_size, -(-tail // self.page_size) * self.page_size))

    def _delete_leaf(self, node: TreeNode, policy_key: tuple) -> int:
        parent, key = node.parent, node.key
        size = key.token_ids.shape[0]
        del parent.children[self.child_key(key)]
        self._evictable_size -= size
        self.evicted_tokens += size
        self.evicted_nodes += 1
        self.evictable_leaves.discard(node)
        self._update_leaf_status(parent)
        if self.events.enabled:
            self.events.append(ev.EvictEvent, self.clock(), node=node.id, parent=parent.id,
                               token_ids=tuple(node.key.token_ids.tolist()), slots=tuple(node.value.tolist()),
                               last_access_time=node.last_access_time,
                               policy_key=tuple(float(x) for x in policy_key))
        self.allocator.free(node.value)   # before the policy's hook: a hook that raises loses no slot
        node.parent = None  # marks the node as gone; a later dec_lock_ref on it is rejected
        self.policy.on_evict(node)  # policy hook
        return size

    def eviction_order(self, k: Optional[int] = None) -> list[TreeNode]:
        """The next `k` victims (all when None) in the order `evict` would take them; changes nothing.

        Whole leaves: where a policy frees only a leaf's tail (`evict_tail`), the leaf named here is the
        one whose tail goes first (listing the parts would mean splitting the tree)."""
        heap = self._heap()
        heapq.heapify(heap)
        left = {}
        order: list[TreeNode] = []
        while heap and (k is None or len(order) < k):
            _, node = heapq.heappop(heap)
            order.append(node)
            parent = node.parent
            if parent is self.root_node or parent.lock_ref > 0:
                continue
            left[parent.id] = left.get(parent.id, len(parent.children)) - 1
            if left[parent.id] == 0:
                heapq.heappush(heap, (self.policy(parent), parent))
        return order
