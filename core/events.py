"""Typed cache events in a bounded, sequence-numbered log: the dashboard is drawn from these.

Every mutation of the cache (match, split, insert, alloc, free, evict, lock, unlock) appends
one event with a global increasing `seq` and the logical `time`, so a viewer can ask "what
happened since seq N" and replay history (time travel) without touching the cache itself.
"""
from __future__ import annotations

import dataclasses
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Optional


@dataclass(frozen=True)
class Event:
    seq: int
    time: float
    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kind"] = self.kind
        return d


@dataclass(frozen=True)
class MatchEvent(Event):
    tokens_asked: int
    tokens_hit: int
    path: tuple[int, ...]           # node ids from the root's child down to the last matched node
    extra_key: Optional[str] = None
    kind: ClassVar[str] = "match"


@dataclass(frozen=True)
class SplitEvent(Event):
    node: int                        # the node that was cut; it keeps the suffix of its edge
    new_parent: int                  # the new node holding the common prefix
    position: int                    # tokens of the edge that went to the new parent
    kind: ClassVar[str] = "split"


@dataclass(frozen=True)
class InsertEvent(Event):
    node: int
    parent: int
    token_ids: tuple[int, ...]
    slots: tuple[int, ...]
    kind: ClassVar[str] = "insert"


@dataclass(frozen=True)
class AllocEvent(Event):
    slots: tuple[int, ...]
    kind: ClassVar[str] = "alloc"


@dataclass(frozen=True)
class FreeEvent(Event):
    slots: tuple[int, ...]
    kind: ClassVar[str] = "free"


@dataclass(frozen=True)
class EvictEvent(Event):
    node: int
    parent: int
    token_ids: tuple[int, ...]
    slots: tuple[int, ...]
    last_access_time: float
    policy_key: tuple[float, ...]
    kind: ClassVar[str] = "evict"


@dataclass(frozen=True)
class LockEvent(Event):
    node: int
    path: tuple[int, ...]
    kind: ClassVar[str] = "lock"


@dataclass(frozen=True)
class UnlockEvent(Event):
    node: int
    path: tuple[int, ...]
    kind: ClassVar[str] = "unlock"


@dataclass(frozen=True)
class ResetEvent(Event):
    kind: ClassVar[str] = "reset"


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls for cls in (MatchEvent, SplitEvent, InsertEvent, AllocEvent, FreeEvent,
                              EvictEvent, LockEvent, UnlockEvent, ResetEvent)
}


class EventLog:
    """A ring of the last `capacity` events. `seq` keeps counting past the ring's end."""

    def __init__(self, capacity: int = 100_000, enabled: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"EventLog capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.enabled = enabled
        self._events: deque[Event] = deque(maxlen=capacity)
        self._seq = 0
        self._lock = threading.Lock()

    @property
    def last_seq(self) -> int:
        return self._seq

    def append(self, cls: type[Event], time: float, **fields: Any) -> Optional[Event]:
        if not self.enabled:
            return None
        with self._lock:
            self._seq += 1
            ev = cls(seq=self._seq, time=time, **fields)
            self._events.append(ev)
            return ev

    def since(self, seq: int) -> list[Event]:
        """Events with a sequence number greater than `seq` still in the ring, oldest first."""
        with self._lock:
            if not self._events or self._events[-1].seq <= seq:
                return []
            first = self._events[0].seq
            start = max(0, seq + 1 - first)
            return list(self._events)[start:]

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterable[Event]:
        with self._lock:
            return iter(list(self._events))
