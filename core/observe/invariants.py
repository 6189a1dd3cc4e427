"""Every structural promise of the radix cache, checked from scratch with a precise message.

Tests call this after every operation; it recomputes sizes, leaf sets and slot ownership
instead of trusting the counters the cache maintains incrementally.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from core.cache.radix_cache import RadixCache


class InvariantError(AssertionError):
    """A broken cache invariant (a bug, never a user error)."""


def _fail(msg: str) -> None:
    raise InvariantError(msg)


def check_cache_invariants(cache: "RadixCache", held_slots: Optional[torch.Tensor] = None) -> None:
    """Raise InvariantError naming the first broken invariant.

    `held_slots`: slots callers own outside the tree (running requests). When given, the full
    conservation law is checked: free + tree + held == capacity, with no slot in two places.
    """
    root = cache.root_node
    ps = cache.page_size
    evictable = protected = 0
    leaves = set()
    tree_slots = []
    for node in cache.nodes():
        if node is not root:
            if len(node.key) != node.value.numel():
                _fail(f"node {node.id}: key has {len(node.key)} tokens, value {node.value.numel()} slots")
            if len(node.key) == 0:
                _fail(f"node {node.id}: empty edge")
            if ps > 1 and len(node.key) % ps:
                _fail(f"node {node.id}: edge of {len(node.key)} tokens is not whole pages of {ps}")
            if node.lock_ref < 0:
                _fail(f"node {node.id}: lock_ref {node.lock_ref} < 0")
            if node.parent is None or node.parent.children.get(cache.child_key(node.key)) is not node:
                _fail(f"node {node.id}: its parent's children dict does not map its first token (page) to it")
            if node.lock_ref > node.parent.lock_ref and node.parent is not root:
                _fail(f"node {node.id}: lock_ref {node.lock_ref} above its parent's {node.parent.lock_ref}")
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            if node.is_leaf and node.lock_ref == 0:
                leaves.add(node)
            tree_slots.append(node.value)
            if node.last_access_time < node.creation_time:
                _fail(f"node {node.id}: last_access_time {node.last_access_time} before creation {node.creation_time}")
        for ck, child in node.children.items():
            if child.parent is not node:
                _fail(f"node {child.id}: parent pointer does not point at node {node.id}")
            if ck != cache.child_key(child.key):
                _fail(f"node {node.id}: child key {ck!r} differs from the first token (page) of child {child.id}")
    if evictable != cache.evictable_size():
        _fail(f"evictable_size is {cache.evictable_size()} but unlocked nodes hold {evictable} tokens")
    if protected != cache.protected_size():
        _fail(f"protected_size is {cache.protected_size()} but locked nodes hold {protected} tokens")
    if leaves != cache.evictable_leaves:
        _fail(f"evictable_leaves {sorted(n.id for n in cache.evictable_leaves)} != unlocked leaves "
              f"{sorted(n.id for n in leaves)}")
    _check_slots(cache, tree_slots, held_slots)


def _check_slots(cache: "RadixCache", tree_slots: list, held_slots: Optional[torch.Tensor]) -> None:
    alloc = cache.allocator
    size = alloc.num_slots + alloc.page_size
    tree = torch.cat(tree_slots).cpu().long() if tree_slots else torch.empty(0, dtype=torch.int64)
    free = alloc.free_slots().cpu().long()
    parts = {"tree": tree, "free_pages": free}
    if held_slots is not None:
        parts["callers"] = held_slots.reshape(-1).to("cpu", torch.int64)
    owner = torch.zeros(size, dtype=torch.int64)
    for name, slots in parts.items():
        if slots.numel() and (int(slots.min()) < alloc.page_size or int(slots.max()) >= size):
            _fail(f"{name} holds a slot outside {alloc.page_size}..{size - 1}")
        counts = torch.bincount(slots, minlength=size)
        twice = torch.nonzero((owner > 0) & (counts > 0)).flatten()
        if twice.numel() or bool((counts > 1).any()):
            slot = int(twice[0]) if twice.numel() else int(torch.nonzero(counts > 1)[0])
            _fail(f"slot {slot} is owned twice ({name} and another owner, or twice within {name})")
        owner += counts
    mask_free = alloc.is_free_mask().cpu()
    if not torch.equal(mask_free.nonzero().flatten().sort().values, free.sort().values):
        _fail("the allocator's free mask disagrees with free_pages")
    if held_slots is not None and int(owner.sum()) != alloc.num_slots:
        _fail(f"slot conservation broken: free {free.numel()} + tree {tree.numel()} + callers "
              f"{parts['callers'].numel()} != capacity {alloc.num_slots}")
    if held_slots is None and tree.numel() + free.numel() > alloc.num_slots:
        _fail(f"tree {tree.numel()} + free {free.numel()} slots exceed capacity {alloc.num_slots}")
