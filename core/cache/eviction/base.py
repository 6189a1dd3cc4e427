"""What a policy is: `EvictionPolicy` (a key per leaf + cache hooks) and SGLang's static key policies.

The radix cache evicts the unlocked leaf with the lowest priority key first.

Two kinds, one interface (`EvictionPolicy`):
- key policies (lru, lfu, fifo, mru, filo, priority, slru): a static key over a leaf, mirroring
  SGLang's strategies, so a choice made here transfers to a real SGLang deployment;
- stateful policies (classic.py, lhd.py, recall.py, learned.py in this folder): they learn from the events the cache reports
  (insert, a request's match through a node, split, evict) and compute their key from that state.
  The cache calls `begin_evict` once per `evict` call, then keys every evictable leaf as before.

Every hook is O(1) per node it names, so adding them costs the key policies nothing measurable.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from core.cache.radix_node import TreeNode


class PolicyCache(Protocol):
    """What a policy may read of the cache it serves (the cache hands itself to `attach`). A protocol,
    not the RadixCache class: the cache imports the policies, so they must not import it back."""

    page_size: int
    allocator: Any            # .num_slots: the pool the policy sizes its state by
    evictable_leaves: Any     # the leaves a policy may rank (a set of TreeNode)

PolicyKey = Callable[["TreeNode"], tuple]

SLRU_PROTECTED_HITS = 2

# Key policies whose key of a node never decreases while the node stays in the tree (access times, hit
# counts and priorities only grow; creation times never change). For them the cache keeps one heap across
# evict calls (core/cache/radix_cache.py): an entry whose key grew since its push is pushed again when popped.
MONOTONE_KEYS = frozenset({"lru", "lfu", "fifo", "filo", "priority", "slru"})  # a node hit at least this often sits in the protected segment


def lru_key(n: "TreeNode") -> tuple:
    return (n.last_access_time,)


def lfu_key(n: "TreeNode") -> tuple:
    return (n.hit_count, n.last_access_time)


def fifo_key(n: "TreeNode") -> tuple:
    return (n.creation_time,)


def mru_key(n: "TreeNode") -> tuple:
    return (-n.last_access_time,)


def filo_key(n: "TreeNode") -> tuple:
    return (-n.creation_time,)


def priority_key(n: "TreeNode") -> tuple:
    return (n.priority, n.last_access_time)


def slru_key(n: "TreeNode") -> tuple:
    # Probationary nodes (one request so far) go before protected ones (a second request inserted over
    # them: hit_count is counted per request by RadixCache.insert); LRU within each segment.
    return (1 if n.hit_count >= SLRU_PROTECTED_HITS else 0, n.last_access_time)


class EvictionPolicy:
    """What the radix cache asks of a policy. Subclasses keep state; the base class keeps none.

    `key(node)`: lower is evicted first; only unlocked leaves are ever keyed for eviction.
    Hooks (all no-ops here): the cache calls them with the nodes an operation touched.
    """

    name = "base"
    stateful = False
    monotone = False   # True: key(node) only grows while the node is in the tree (see MONOTONE_KEYS)

    def attach(self, cache: PolicyCache) -> None:
        """Called once by the cache (and again on reset): size the state to the pool."""
        self.capacity = max(1, int(cache.allocator.num_slots))

    def key(self, node: "TreeNode") -> tuple:
        raise NotImplementedError

    def __call__(self, node: "TreeNode") -> tuple:
        return self.key(node)

    def on_insert(self, node: "TreeNode", now: float) -> None:
        """A new leaf `node` holds tokens the cache had not."""

    def on_match(self, path: Sequence["TreeNode"], now: float) -> None:
        """A request matched through `path` (root's child first); the last node may be a split-off head."""

    def on_split(self, head: "TreeNode", tail: "TreeNode") -> None:
        """`tail`'s edge was cut: `head` is its new parent holding the first part."""

    def on_evict(self, node: "TreeNode") -> None:
        """`node` (a leaf) leaves the tree."""

    def on_finish(self, node: "TreeNode", output_len: int) -> None:
        """A request finished (cache_finished_req): `node` is the deepest node holding its tokens and it
        generated `output_len` tokens. Known only now, so a policy can class the request's pages by it."""

    def begin_evict(self) -> None:
        """An `evict` (or `eviction_order`) call is about to key the evictable leaves."""

    def evict_tail(self, node: "TreeNode") -> int:
        """Tokens to free off the end of leaf `node`, the lowest-keyed leaf (all of them: the whole leaf).

        Fewer frees only the leaf's last pages (rounded up to whole pages): the cache splits it and the
        head stays, a leaf with its own key. Lets a policy drop a prompt's low-value tail and keep its head.
        """
        return len(node.key)


class KeyPolicy(EvictionPolicy):
    """A static key function as a policy (no state, no hooks)."""

    def __init__(self, name: str, fn: PolicyKey) -> None:
        self.name = name
        self.key = fn            # an instance attribute: the cache's hot loop calls it directly
        self.monotone = name in MONOTONE_KEYS

    def __call__(self, node: "TreeNode") -> tuple:
        return self.key(node)


KEY_POLICIES: dict[str, PolicyKey] = {
    "lru": lru_key, "lfu": lfu_key, "fifo": fifo_key, "mru": mru_key,
    "filo": filo_key, "priority": priority_key, "slru": slru_key,
}

KEY_DESCRIPTIONS: dict[str, str] = {
    "lru": "least recently used leaf first (SGLang's default)",
    "lfu": "fewest hits first, then least recently used",
    "fifo": "oldest inserted first",
    "mru": "most recently used first",
    "filo": "newest inserted first",
    "priority": "lowest request priority first, then least recently used",
    "slru": "segmented LRU: nodes hit twice or more are evicted after all others",
}
