"""The namespace (extra_key) of each new edge under the root, which InsertEvent does not carry.

Below the root every edge shares its parent's extra_key (the tree keys children by
(extra_key, first page)), so only a root child's namespace is unknown from the event alone, and
by the time the publisher thread reads the event that node may already be evicted. The tap wraps
the cache's event log `append` (on the instance only) and, for an insert under the root, reads
the new node's key right then, in the engine thread. If InsertEvent ever carries `extra_key`
itself, that field wins and the tap is a no-op.
"""
from __future__ import annotations

from typing import Optional

from core import events as ev


class ExtraKeyTap:
    def __init__(self, cache) -> None:
        self.cache = cache
        self._keys: dict[int, Optional[str]] = {}   # InsertEvent seq -> extra_key
        self._orig = None

    def install(self) -> None:
        log = self.cache.events
        if not log.enabled:
            raise ValueError("the cache records no events (record_events=False); KV events are made "
                             "from its event log: build the cache with record_events=True")
        if self._orig is not None:
            return
        orig = log.append
        cache, keys = self.cache, self._keys

        def append(cls, time, **fields):
            out = orig(cls, time, **fields)
            if cls is ev.InsertEvent and out is not None and "extra_key" not in fields:
                root = cache.root_node
                if fields["parent"] == root.id:
                    keys[out.seq] = _root_child_extra_key(cache, root, out.node, fields["token_ids"])
            return out

        log.append = append
        self._orig = orig

    def remove(self) -> None:
        if self._orig is not None and "append" in vars(self.cache.events):
            del self.cache.events.append
        self._orig = None

    def extra_key(self, insert_event) -> Optional[str]:
        if hasattr(insert_event, "extra_key"):
            return insert_event.extra_key
        return self._keys.pop(insert_event.seq, None)

    def drop_through(self, seq: int) -> None:
        """Forget inserts up to `seq` (a resync read them from a snapshot instead)."""
        for s in [s for s in list(self._keys) if s <= seq]:
            self._keys.pop(s, None)


def _root_child_extra_key(cache, root, node_id: int, token_ids) -> Optional[str]:
    ps = cache.page_size
    first = int(token_ids[0]) if ps == 1 else tuple(int(t) for t in token_ids[:ps])
    child = root.children.get(first)
    if child is not None and child.id == node_id:
        return None
    for child in root.children.values():
        if child.id == node_id:
            return child.key.extra_key
    return None
