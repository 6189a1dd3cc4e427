"""The per-token baseline of bench_radix.py (`--baseline loop`): the same radix-tree algorithm written the
straightforward way, lists of ints and one Python comparison per token, the same LRU heap and tie-break.
tests/cache/eviction/test_registry.py holds RadixCache to it on a small differential case."""
from __future__ import annotations

import heapq
import time
from collections import deque


def _add_phases(phases: dict, t0: float, t1: float, t2: float, t3: float, t4: float, t5: float,
                t6: float) -> None:
    """Split one request's time: t0 match t1 lock t2 alloc/evict t3 insert t4 free t5 unlock t6."""
    phases["match"] += t1 - t0
    phases["insert"] += t4 - t3
    phases["slots"] += (t3 - t2) + (t5 - t4)
    phases["lock"] += (t2 - t1) + (t6 - t5)


class _Node:
    __slots__ = ("id", "children", "parent", "key", "value", "lock_ref", "last_access_time")

    def __init__(self, nid, key, value, parent, now):
        self.id, self.key, self.value, self.parent = nid, key, value, parent
        self.children = {}
        self.lock_ref = 0
        self.last_access_time = now


class LoopRadixTree:
    """A plain-Python radix cache: list keys, per-token matching, LRU heap eviction."""

    def __init__(self, capacity: int) -> None:
        self.free_slots = deque(range(1, capacity + 1))
        self.next_id = 1
        self.root = _Node(0, [], [], None, 0)
        self.root.lock_ref = 1
        self.evictable = set()
        self.now = 0

    def _new(self, key, value, parent):
        node = _Node(self.next_id, key, value, parent, self.now)
        self.next_id += 1
        return node

    def _leaf_status(self, node):
        if node is not self.root and not node.children and node.lock_ref == 0:
            self.evictable.add(node)
        else:
            self.evictable.discard(node)

    def alloc(self, n):
        if n > len(self.free_slots):
            return None
        pop = self.free_slots.popleft
        return [pop() for _ in range(n)]

    def free(self, slots):
        self.free_slots.extend(slots)

    def _split(self, child, i):
        new = self._new(child.key[:i], child.value[:i], child.parent)
        new.lock_ref = child.lock_ref
        child.parent.children[child.key[0]] = new
        child.key, child.value = child.key[i:], child.value[i:]
        child.parent = new
        child.last_access_time = self.now
        new.children[child.key[0]] = child
        return new

    def _walk(self, key):
        """Shared by match and insert: returns (node, pos, values) with a split where the match stops."""
        node, pos, n, values = self.root, 0, len(key), []
        node.last_access_time = self.now
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access_time = self.now
            ck, m, i = child.key, len(child.key), 0
            while i < m and pos + i < n and ck[i] == key[pos + i]:
                i += 1
            if i < m:
                node = self._split(child, i)
                values.extend(node.value)
                pos += i
                break
            values.extend(child.value)
            pos += i
            node = child
        return node, pos, values

    def match_prefix(self, key):
        node, _, values = self._walk(key)
        return values, node

    def insert(self, key, value):
        node, pos, _ = self._walk(key)
        if pos < len(key):
            leaf = self._new(key[pos:], value[pos:], node)
            node.children[key[pos]] = leaf
            self.evictable.discard(node)
            self._leaf_status(leaf)
        return pos

    def inc_lock_ref(self, node):
        while node is not self.root:
            node.lock_ref += 1
            self.evictable.discard(node)
            node = node.parent

    def dec_lock_ref(self, node):
        while node is not self.root:
            node.lock_ref -= 1
            self._leaf_status(node)
            node = node.parent

    def evict(self, num_tokens):
        heap = [(n.last_access_time, n.id, n) for n in self.evictable]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.key[0]]
            self.evictable.discard(node)
            self._leaf_status(parent)
            self.free(node.value)
            freed += len(node.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        return freed

    def total_size(self):
        total, stack = 0, [self.root]
        while stack:
            n = stack.pop()
            total += len(n.key)
            stack.extend(n.children.values())
        return total


class LoopRun:
    """The baseline, stepped the same way."""

    def __init__(self, capacity: int) -> None:
        self.tree = LoopRadixTree(capacity)
        self.hit = self.evicted = 0

    def step(self, t: int, key: list[int], phases: dict, clock=time.perf_counter) -> None:
        tree = self.tree
        tree.now = t
        t0 = clock()
        prefix, node = tree.match_prefix(key)
        t1 = clock()
        tree.inc_lock_ref(node)
        t2 = clock()
        p = len(prefix)
        need = len(key) - p
        new = tree.alloc(need)
        if new is None:
            self.evicted += tree.evict(need - len(tree.free_slots))
            new = tree.alloc(need)
        value = prefix + new if p else new
        t3 = clock()
        returned = tree.insert(key, value)
        t4 = clock()
        tree.free(value[p:returned])
        t5 = clock()
        tree.dec_lock_ref(node)
        t6 = clock()
        _add_phases(phases, t0, t1, t2, t3, t4, t5, t6)
        self.hit += p

    def result(self) -> dict:
        return {"hit": self.hit, "evicted": self.evicted, "cached": self.tree.total_size(),
                "free": len(self.tree.free_slots)}


