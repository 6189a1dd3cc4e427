"""Typed cache events in a bounded, sequence-numbered log: the dashboard is drawn from these.

Every mutation of the cache (match, split, insert, touch, alloc, free, evict, lock, unlock) appends
one event with a global increasing `seq` and the logical `time`, so a viewer can ask "what
happened since seq N" and replay history (time travel) without touching the cache itself.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Mapping, Optional, Union


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
    extra_key: Optional[str] = None  # the namespace (cache_salt, LoRA): KV-event hashes include it
    counted: tuple[int, ...] = ()    # the nodes whose hit_count this insert raised (the new one among them)
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
class TouchEvent(Event):
    """An insert that added nothing still stamps its path (time travel must see that touch)."""
    node: int
    path: tuple[int, ...]
    counted: tuple[int, ...] = ()    # the nodes whose hit_count this insert raised
    kind: ClassVar[str] = "touch"


@dataclass(frozen=True)
class ResetEvent(Event):
    kind: ClassVar[str] = "reset"


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls for cls in (MatchEvent, SplitEvent, InsertEvent, AllocEvent, FreeEvent,
                              EvictEvent, LockEvent, UnlockEvent, TouchEvent, ResetEvent)
}


POOL_KINDS = frozenset({"alloc", "free", "reset"})

# An event object, or its `to_dict()` form (what a remote engine sends): viewers read both alike.
EventLike = Union[Event, Mapping[str, Any]]


def ev_get(event: EventLike, name: str, default: Any = None) -> Any:
    """A field of an event object or of its dict form."""
    if isinstance(event, Mapping):
        return event.get(name, default)
    return getattr(event, name, default)


def ev_kind(event: EventLike) -> str:
    return str(ev_get(event, "kind", "event"))


# What an event costs in memory, roughly: the object and its fields, plus per element of a tuple
# field a pointer and (token ids and slots are mostly > 256, so not cached) an int object.
EVENT_BASE_BYTES = 200
BYTES_PER_ELEMENT = 36
DEFAULT_BUDGET_BYTES = 32 * 2**20


def event_bytes(e: Event) -> int:
    """An estimate of the memory `e` holds (exact enough to bound a log by; no sys.getsizeof walk)."""
    n = 0
    for name in _TUPLE_FIELDS.get(type(e), ()):
        n += len(getattr(e, name))
    key = getattr(e, "extra_key", None)     # a namespace string each event of a request holds
    return EVENT_BASE_BYTES + BYTES_PER_ELEMENT * n + (len(key) if key else 0)


class EventLog:
    """The most recent events, at most `capacity` of them and about `budget_bytes` of memory
    (a 2,000-token insert holds ~70 kB, so counting events alone does not bound memory).
    `seq` keeps counting past what fell off. Reads cost O(events returned)."""

    def __init__(self, capacity: int = 100_000, enabled: bool = True,
                 budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if capacity < 1:
            raise ValueError(f"EventLog capacity must be >= 1, got {capacity}")
        if budget_bytes < 1:
            raise ValueError(f"EventLog budget_bytes must be >= 1, got {budget_bytes}")
        self.capacity = capacity
        self.budget_bytes = budget_bytes
        self.enabled = enabled
        self._events: deque[Event] = deque()
        self._sizes: deque[int] = deque()
        self._bytes = 0
        self._seq = 0
        self.last_tree_seq = 0      # seq of the last event that changed the tree (not alloc/free)
        self.last_pool_seq = 0      # seq of the last alloc, free or reset
        self._lock = threading.Lock()

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def nbytes(self) -> int:
        """Estimated memory the kept events hold."""
        return self._bytes

    def append(self, cls: type[Event], time: float, **fields: Any) -> Optional[Event]:
        if not self.enabled:
            return None
        with self._lock:
            self._seq += 1
            ev = cls(seq=self._seq, time=time, **fields)
            if cls.kind in POOL_KINDS:
                self.last_pool_seq = self._seq
            if cls.kind not in POOL_KINDS or cls.kind == "reset":
                self.last_tree_seq = self._seq
            size = event_bytes(ev)
            self._events.append(ev)
            self._sizes.append(size)
            self._bytes += size
            while len(self._events) > 1 and (len(self._events) > self.capacity or self._bytes > self.budget_bytes):
                self._events.popleft()
                self._bytes -= self._sizes.popleft()
            return ev

    def since(self, seq: int, limit: Optional[int] = None) -> list[Event]:
        """Events with a sequence number greater than `seq` still kept, oldest first (the first
        `limit` of them when given). Walks from the newest end: O(events after seq)."""
        with self._lock:
            events = self._events
            if not events or events[-1].seq <= seq:
                return []
            first = events[0].seq
            count = len(events) - max(0, seq + 1 - first)   # seqs are consecutive in the log
            out = list(itertools.islice(reversed(events), count))
        out.reverse()
        return out if limit is None else out[:max(0, limit)]

    def page(self, since: int, limit: int, newest: bool = False) -> list[Event]:
        """At most `limit` events with seq > `since`, oldest first: the oldest of them (a forward
        page: ask again from the last seq), or with `newest` the newest of them. O(events returned)."""
        limit = max(0, int(limit))
        with self._lock:
            events = self._events
            if not events or events[-1].seq <= since or limit == 0:
                return []
            start = max(0, since + 1 - events[0].seq)       # seqs are consecutive in the log
            count = len(events) - start
            if newest or count <= limit:                    # a short tail (the usual poll): from the end
                out = list(itertools.islice(reversed(events), min(count, limit)))
                out.reverse()
                return out
            return list(itertools.islice(events, start, start + limit))

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        with self._lock:
            return iter(list(self._events))


_TUPLE_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls) if f.name in ("path", "token_ids", "slots", "policy_key"))
    for cls in EVENT_TYPES.values()
}
