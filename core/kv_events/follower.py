"""Following one KV event stream in sequence order: gaps found, never silently skipped.

Pure bookkeeping, no sockets (the subscriber and a recording's replay both drive it): `offer`
applies a frame when it is the next one; when frames are missing it holds the frame and returns
the `Gap`, the caller fetches the missing batches (the engine's replay socket) and hands them to
`resolve`, which applies what came back in order and marks the gap recovered or not.

What a replay cannot give back is lost, and only that: the engines' replay buffer is the last
`buffer_steps` batches, so a subscriber that joins (or falls behind) further back than that gets
the buffer's tail. That tail is applied; the gap is narrowed to the seqs truly lost (its `start`
to `end`), recorded once and counted once in `missing_batches`; the held frame is applied after
it, so the next frame is in order and nothing is fetched twice. A catch-up's "joined late" gap
stays open until the first live frame: a frame the SUB missed while its subscription was still
reaching the publisher (ZMQ's slow joiner) is part of joining, and a replay that returns it
extends that gap instead of logging a second one.

Every frame arrives by one path, "live" (`offer`) or "replay" (`resolve`, `catch_up`), and is
kept in `arrivals` (the latest ones). A seq is applied once, by whichever copy comes first in
order; every other copy of an applied batch is a duplicate: a live frame that a catch-up already
replayed, a replayed batch that had arrived live (the held frame that opened the gap, or batches
published while the replay was served), a batch a replay returned twice. So, for the applied
seqs, `duplicates` == sum over seqs of (copies received - 1).

`on_gap(gap)` is called once per gap when its outcome is known, before the frames after it are
applied (a recorder writes it there, so a recording's gaps come back with `expect_gap`).
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from core.kv_events.block_tree import BlockTree
from core.kv_events.protocol import AllBlocksCleared, DecodeError, decode_batch

RESTARTED = "publisher restarted"


@dataclass
class Gap:
    start: int                 # first missing seq (after `resolve`: first seq lost for good, if any)
    end: int                   # last missing seq (after `resolve`: last seq lost for good, if any)
    detected_ts: float
    reason: str                # "missing batches", "joined late", "undecodable batch", "publisher restarted"
    recovered: Optional[bool] = None   # None while a replay is pending; False: start..end are lost
    replayed: int = 0          # batches the replay socket gave back for it (applied from the replay)

    @property
    def size(self) -> int:
        return self.end - self.start + 1

    @property
    def lost(self) -> int:
        """Batches this gap cost for good (0 when the replay filled it, or for a restart)."""
        return self.size if self.recovered is False and self.reason != RESTARTED else 0

    def as_dict(self) -> dict:
        return {"start": self.start, "end": self.end, "reason": self.reason, "recovered": self.recovered,
                "replayed": self.replayed, "lost": self.lost, "detected_ts": self.detected_ts}

    @classmethod
    def from_dict(cls, d: dict) -> "Gap":
        return cls(int(d["start"]), int(d["end"]), float(d.get("detected_ts", 0.0)), str(d["reason"]),
                   d.get("recovered"), int(d.get("replayed", 0)))


Replayed = tuple  # (seq, payload, topic): a frame from the replay socket


class StreamFollower:
    def __init__(self, tree: Optional[BlockTree] = None,
                 on_frame: Optional[Callable[[int, bytes, bytes, Optional[float]], None]] = None,
                 on_gap: Optional[Callable[[Gap], None]] = None) -> None:
        self.tree = tree if tree is not None else BlockTree()
        self.on_frame = on_frame            # (seq, topic, payload, ts) for each frame applied, or undecodable (ts None)
        self.on_gap = on_gap                # called with each gap once its outcome is known
        self.last_seq: Optional[int] = None
        self.gaps: list[Gap] = []
        self.batches = 0
        self.duplicates = 0
        self.arrivals: deque = deque(maxlen=10_000)   # (seq, "live" | "replay") of each frame, in order
        self.dp_ranks: set = set()
        self.last_ts: Optional[float] = None   # the latest batch's own timestamp
        self.last_recv: Optional[float] = None  # wall clock when the latest frame arrived
        self.suspect_since: Optional[int] = None  # an unrecovered gap: the tree may miss blocks
        self._held: Optional[Replayed] = None
        self._joining: Optional[Gap] = None    # the catch-up's gap, until the first live frame
        self._fold: Optional[Gap] = None       # the pending gap continues the catch-up's
        self._expected: list[Gap] = []         # gaps a recording says are coming (`expect_gap`)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)

    # ----- frames in ------------------------------------------------------------------------
    def offer(self, seq: int, payload: bytes, topic: bytes = b"") -> Optional[Gap]:
        """Apply the frame if it is next; return a Gap (frame held) when some are missing."""
        with self.lock:
            self.last_recv = time.time()
            self.arrivals.append((seq, "live"))
            joining, self._joining = self._joining, None
            if self.last_seq is not None and seq <= self.last_seq:
                if not self._restarted(seq, payload):
                    self.duplicates += 1
                    return None
                # seq starts over: a new publisher on this address (its cache starts empty)
                self._settled(self._gap(0, 0, RESTARTED, recovered=True))
                self.tree.clear()
                self.last_seq = None
                joining = None
            expected = 0 if self.last_seq is None else self.last_seq + 1
            if seq > expected:
                reason = "joined late" if self.last_seq is None or joining is not None else "missing batches"
                self._fold = joining
                self._held = (seq, payload, topic)
                return self._gap(expected, seq - 1, reason)
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

    def resolve(self, gap: Gap, replayed: Iterable[Replayed]) -> None:
        """Apply batches a replay returned (any order, duplicates fine), then the held frame. What
        the replay no longer holds is lost: the gap is narrowed to it (recovered=False)."""
        with self.lock:
            held, self._held = self._held, None
            fold, self._fold = self._fold, None
            frames, lost = self._plan(replayed, held)
            n_replayed = sum(1 for f in frames if f[3] == "replay")
            extra = self._settle(gap, lost, n_replayed, fold)
            for g in extra:
                self._settled(g)
            self._apply_all(frames)
            self.changed.notify_all()

    def catch_up(self, replayed: Iterable[Replayed]) -> Optional[Gap]:
        """Apply a replay from seq 0 taken when joining a running stream. Returns the "joined late"
        gap it filled (or narrowed to the batches the buffer no longer held), or None when the replay
        was empty or live frames got here first (then what it returned is applied if next, and
        counted as duplicates if already applied)."""
        with self.lock:
            frames = list(replayed)
            if self.last_seq is not None or self._held is not None or not frames:
                todo, lost = self._plan(frames, None)
                for start, end in lost:
                    self._settled(self._gap(start, end, "missing batches", recovered=False))
                self._apply_all(todo)
                self.changed.notify_all()
                return None
            gap = self._gap(0, max(f[0] for f in frames), "joined late")
            self.resolve(gap, frames)
            self._joining = gap
            return gap

    def expect_gap(self, gap: Gap) -> Gap:
        """A gap a recording says its recorder saw (how it ended included): listed now, and when the
        replayed frames show the same hole (its lost seqs, or the restart) it is that gap, not a new one."""
        with self.lock:
            self.gaps.append(gap)
            self._expected.append(gap)
            return gap

    # ----- inside ---------------------------------------------------------------------------
    def _gap(self, start: int, end: int, reason: str, recovered: Optional[bool] = None) -> Gap:
        """A new gap, or the expected one (from a recording) that covers the same seqs."""
        for i, g in enumerate(self._expected):
            if (g.start, g.end) == (start, end) and (reason == RESTARTED) == (g.reason == RESTARTED):
                del self._expected[i]
                return g
        gap = Gap(start, end, time.time(), reason, recovered)
        self.gaps.append(gap)
        return gap

    def _plan(self, replayed: Iterable[Replayed], held: Optional[Replayed]) -> tuple[list, list]:
        """The frames to apply, in seq order, from the replay and the held frame (a replayed copy
        first); and the seq ranges neither holds (lost). Copies of seqs already applied, or
        repeated, are duplicates."""
        frames = [(*f, "replay") for f in replayed]
        self.arrivals.extend((f[0], "replay") for f in sorted(frames, key=lambda f: f[0]))
        if held is not None:
            frames.append((*held, "held"))
        todo: list = []
        lost: list = []
        nxt = 0 if self.last_seq is None else self.last_seq + 1
        for frame in sorted(frames, key=lambda f: (f[0], f[3] == "held")):
            seq = frame[0]
            if seq < nxt:
                self.duplicates += 1   # e.g. the held frame the replay gave back too: applied once, from there
                continue
            if seq > nxt:
                lost.append((nxt, seq - 1))
            todo.append(frame)
            nxt = seq + 1
        return todo, lost

    def _settle(self, gap: Gap, lost: list, replayed: int, fold: Optional[Gap]) -> list[Gap]:
        """Say how `gap` ended; returns further gaps for holes after its first one (a truncated replay)."""
        gap.replayed += replayed
        if not lost:
            gap.recovered = True
            if fold is not None and gap is not fold:   # the slow joiner's frames: still joining
                self.gaps.remove(gap)
                if fold.recovered:
                    fold.end = max(fold.end, gap.end)
                fold.replayed += gap.replayed
                return []
            self._settled(gap)
            return []
        (gap.start, gap.end), gap.recovered = lost[0], False
        self._settled(gap)
        return [self._gap(s, e, gap.reason, recovered=False) for s, e in lost[1:]]

    def _settled(self, gap: Gap) -> None:
        if gap.recovered is False:
            self.suspect_since = gap.start if self.suspect_since is None else self.suspect_since
        if self.on_gap is not None:
            self.on_gap(gap)

    def _apply_all(self, frames: list) -> None:
        for seq, payload, topic, _ in frames:
            self._apply(seq, payload, topic)

    def _apply(self, seq: int, payload: bytes, topic: bytes) -> None:
        self.last_seq = seq
        try:
            batch = decode_batch(payload)
        except DecodeError as e:
            self._settled(self._gap(seq, seq, f"undecodable batch: {e}", recovered=False))
            if self.on_frame is not None:   # the recorder keeps its bytes too: replayed, the same one gap (it
                self.on_frame(seq, topic, payload, None)   # counted twice: the gap and a hole in the seqs)
            self.changed.notify_all()
            return
        self.tree.apply(batch, seq)
        self.batches += 1
        if math.isfinite(batch.ts):     # a NaN kept here would make every later comparison False: no restart
            self.last_ts = batch.ts     # of the publisher would ever be seen again (_restarted)
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
            open_gaps = [g for g in self.gaps if g.lost]
            return {"last_seq": self.last_seq, "batches": self.batches, "duplicates": self.duplicates,
                    "gaps": len(self.gaps), "unrecovered_gaps": len(open_gaps),
                    "missing_batches": sum(g.lost for g in open_gaps),
                    "exact": self.suspect_since is None, "suspect_since": self.suspect_since,
                    "dp_ranks": sorted(self.dp_ranks), "last_ts": self.last_ts, "last_recv": self.last_recv}
