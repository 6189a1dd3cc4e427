"""Following one KV event stream in sequence order: gaps found, never silently skipped.

Pure bookkeeping, no sockets (the subscriber and a recording's replay both drive it): `offer`
applies a frame when it is the next one; when frames are missing it holds the frame and returns
the `Gap`, the caller fetches the missing batches (the engine's replay socket) and hands them to
`resolve`, which applies what came back in order and marks the gap recovered or not.

Every frame arrives by one path, "live" (`offer`) or "replay" (`resolve`, `catch_up`), and is
kept in `arrivals` (the latest ones). A seq is applied once, by whichever copy comes first in
order; every other copy of an applied batch is a duplicate: a live frame that a catch-up already
replayed, a replayed batch that had arrived live (the held frame that opened the gap, or batches
published while the replay was served), a batch a replay returned twice. So, for the applied
seqs, `duplicates` == sum over seqs of (copies received - 1).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from core.kv_events.block_tree import BlockTree
from core.kv_events.protocol import AllBlocksCleared, DecodeError, decode_batch


@dataclass
class Gap:
    start: int                 # first missing seq
    end: int                   # last missing seq
    detected_ts: float
    reason: str                # "missing batches", "joined late", "undecodable batch", "publisher restarted"
    recovered: Optional[bool] = None   # None while a replay is pending
    replayed: int = 0          # batches the replay socket gave back for it

    @property
    def size(self) -> int:
        return self.end - self.start + 1


class StreamFollower:
    def __init__(self, tree: Optional[BlockTree] = None,
                 on_frame: Optional[Callable[[int, bytes, bytes, float], None]] = None) -> None:
        self.tree = tree if tree is not None else BlockTree()
        self.on_frame = on_frame            # called with (seq, topic, payload, ts) for each applied frame
        self.last_seq: Optional[int] = None
        self.gaps: list[Gap] = []
        self.batches = 0
        self.duplicates = 0
        self.arrivals: deque = deque(maxlen=10_000)   # (seq, "live" | "replay") of each frame, in order
        self.dp_ranks: set = set()
        self.last_ts: Optional[float] = None   # the latest batch's own timestamp
        self.last_recv: Optional[float] = None  # wall clock when the latest frame arrived
        self.suspect_since: Optional[int] = None  # an unrecovered gap: the tree may miss blocks
        self._held: Optional[tuple] = None
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)

    # ----- frames in ------------------------------------------------------------------------
    def offer(self, seq: int, payload: bytes, topic: bytes = b"") -> Optional[Gap]:
        """Apply the frame if it is next; return a Gap (frame held) when some are missing."""
        with self.lock:
            self.last_recv = time.time()
            self.arrivals.append((seq, "live"))
            if self.last_seq is not None and seq <= self.last_seq:
                if not self._restarted(seq, payload):
                    self.duplicates += 1
                    return None
                # seq starts over: a new publisher on this address (its cache starts empty)
                self.gaps.append(Gap(0, 0, time.time(), "publisher restarted", recovered=True))
                self.tree.clear()
                self.last_seq = None
            expected = 0 if self.last_seq is None else self.last_seq + 1
            if seq > expected:
                reason = "joined late" if self.last_seq is None else "missing batches"
                gap = Gap(expected, seq - 1, time.time(), reason)
                self.gaps.append(gap)
                self._held = (seq, payload, topic)
                return gap
            self._apply(seq, payload, topic)
            return None

    def _restarted(self, seq: int, payload: bytes) -> bool:
        """A seq at or below the last one is a duplicate (a late copy, live or replayed) unless its
        batch is newer than every batch applied: then the publisher started over (even if its seq 0
        was lost). Seq 0 follows the same rule: a live copy of seq 0 that a catch-up already applied
        is a duplicate, not a restart (taking it for one would clear the tree and apply it all twice)."""
        try:
            ts = decode_batch(payload).ts
        except DecodeError:
            return False
        return self.last_ts is not None and ts > self.last_ts

    def resolve(self, gap: Gap, replayed: Iterable[tuple[int, bytes, bytes]]) -> None:
        """Apply batches a replay returned (any order, duplicates fine), then the held frame."""
        with self.lock:
            gap.replayed += self._absorb(replayed)
            gap.recovered = self.last_seq is not None and self.last_seq >= gap.end
            if not gap.recovered:
                self.suspect_since = gap.start if self.suspect_since is None else self.suspect_since
            held, self._held = self._held, None
            if held is not None:
                if self.last_seq is None or held[0] > self.last_seq:
                    self._apply(*held)
                else:
                    self.duplicates += 1   # the replay gave this batch back too: applied once, from there
            self.changed.notify_all()

    def catch_up(self, replayed: Iterable[tuple[int, bytes, bytes]]) -> Optional[Gap]:
        """Apply a replay from seq 0 taken when joining a running stream. Returns the "joined late"
        gap it filled, or None when the replay was empty or live frames got here first (then what
        it returned is applied if next, and counted as duplicates if already applied)."""
        with self.lock:
            frames = list(replayed)
            if self.last_seq is not None or self._held is not None or not frames:
                self._absorb(frames)
                self.changed.notify_all()
                return None
            gap = Gap(0, max(f[0] for f in frames), time.time(), "joined late")
            self.gaps.append(gap)
            self.resolve(gap, frames)
            return gap

    def _absorb(self, replayed: Iterable[tuple[int, bytes, bytes]]) -> int:
        """Apply replayed frames in seq order from the next expected one; returns how many applied."""
        applied, stopped = 0, False
        for seq, payload, topic in sorted(replayed, key=lambda f: f[0]):
            self.arrivals.append((seq, "replay"))
            if self.last_seq is not None and seq <= self.last_seq:
                self.duplicates += 1
                continue
            if stopped or seq != (0 if self.last_seq is None else self.last_seq + 1):
                stopped = True   # the replay buffer no longer holds the start of the gap
                continue
            self._apply(seq, payload, topic)
            applied += 1
        return applied

    def _apply(self, seq: int, payload: bytes, topic: bytes) -> None:
        self.last_seq = seq
        try:
            batch = decode_batch(payload)
        except DecodeError as e:
            self.gaps.append(Gap(seq, seq, time.time(), f"undecodable batch: {e}", recovered=False))
            self.suspect_since = seq if self.suspect_since is None else self.suspect_since
            self.changed.notify_all()
            return
        self.tree.apply(batch, seq)
        self.batches += 1
        self.last_ts = batch.ts
        if batch.dp_rank is not None:
            self.dp_ranks.add(batch.dp_rank)
        if any(isinstance(e, AllBlocksCleared) for e in batch.events):
            self.suspect_since = None   # the engine said it holds nothing: we are exact again
        if self.on_frame is not None:
            self.on_frame(seq, topic, payload, batch.ts)
        self.changed.notify_all()

    def wait_for(self, seq: int, timeout: float = 5.0) -> bool:
        """Block until a frame with sequence >= `seq` has been applied (tests, the CLI)."""
        end = time.monotonic() + timeout
        with self.changed:
            while self.last_seq is None or self.last_seq < seq:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return True

    def status(self) -> dict:
        with self.lock:
            open_gaps = [g for g in self.gaps if g.recovered is False]
            return {"last_seq": self.last_seq, "batches": self.batches, "duplicates": self.duplicates,
                    "gaps": len(self.gaps), "unrecovered_gaps": len(open_gaps),
                    "missing_batches": sum(g.size for g in open_gaps if g.reason != "publisher restarted"),
                    "exact": self.suspect_since is None, "suspect_since": self.suspect_since,
                    "dp_ranks": sorted(self.dp_ranks), "last_ts": self.last_ts, "last_recv": self.last_recv}
