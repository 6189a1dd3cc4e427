"""Recordings of a KV event stream: the frames exactly as they arrived, to replay or convert later.

File layout: the magic line `RADIXKV1\n`, then records of a 4-byte big-endian length and a
msgpack array `[received_at, seq, topic, payload]` (payload = the engine's bytes, untouched).
A record with seq -1 (the replay end marker, never a batch's seq) is a gap the recorder saw:
its payload is a msgpack map (start, end, reason, recovered, replayed), written when the gap's
outcome was known, before the frames after it; so `show` lists the gaps of the recording run,
those the replay socket filled included, and not only the holes left in the file.
Records are flushed as they are written, so a recording cut by Ctrl-C or a crash keeps every
whole record; a torn last record is reported, not silently dropped.
"""
from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Iterator, Optional, Union

import msgspec

from core.kv_events.follower import Gap, StreamFollower

MAGIC = b"RADIXKV1\n"
GAP_SEQ = -1   # a record of this seq holds a gap, not a batch
PathLike = Union[str, "os.PathLike[str]"]
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(tuple[float, int, bytes, bytes])


@dataclass(frozen=True)
class Frame:
    received_at: float
    seq: int
    topic: bytes
    payload: bytes


class Recorder:
    """Appends frames to a recording; use as a StreamFollower's `on_frame`."""

    def __init__(self, path: PathLike) -> None:
        try:
            self._f: BinaryIO = open(path, "wb")
        except OSError as e:
            raise ValueError(f"cannot write recording {os.fspath(path)!r}: {e.strerror or e}") from None
        self.path = os.fspath(path)
        self.frames = 0               # batches written
        self.gaps = 0                 # gap records written
        self._lock = threading.Lock()
        self._f.write(MAGIC)
        self._f.flush()

    def write(self, seq: int, topic: bytes, payload: bytes, received_at: float) -> None:
        rec = _enc.encode((float(received_at), int(seq), bytes(topic), bytes(payload)))
        with self._lock:
            self._f.write(struct.pack(">I", len(rec)) + rec)
            self._f.flush()
            if seq == GAP_SEQ:
                self.gaps += 1
            else:
                self.frames += 1

    def __call__(self, seq: int, topic: bytes, payload: bytes, ts: float) -> None:
        self.write(seq, topic, payload, time.time())

    def gap(self, gap: Gap) -> None:
        """Record a follower's gap (use as a StreamFollower's `on_gap`)."""
        self.write(GAP_SEQ, b"", _enc.encode(gap.as_dict()), time.time())

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_recording(path: PathLike, errors: Optional[list] = None) -> Iterator[Frame]:
    """Frames of a recording in file order (its gap records left out). A torn tail is noted in
    `errors` (or raises if None)."""
    return (e for e in read_entries(path, errors) if isinstance(e, Frame))


def read_entries(path: PathLike, errors: Optional[list] = None) -> Iterator[Union[Frame, Gap]]:
    """Frames and the recorder's gaps, in file order."""
    name = os.fspath(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ValueError(f"cannot read recording {name!r}: {e.strerror or e}") from None
    with f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{name!r} is not a KV event recording (no RADIXKV1 header); record one with "
                             f"`python -m core.kv_events record --endpoint tcp://HOST:5557 --out FILE`")
        n = 0
        while True:
            head = f.read(4)
            if not head:
                return
            size = struct.unpack(">I", head)[0] if len(head) == 4 else -1
            body = f.read(size) if size >= 0 else b""
            if size < 0 or len(body) != size:
                msg = f"{name!r}: record {n + 1} is cut short (the recording was interrupted mid-write)"
                if errors is None:
                    raise ValueError(msg)
                errors.append(msg)
                return
            try:
                ts, seq, topic, payload = _dec.decode(body)
            except msgspec.DecodeError as e:
                raise ValueError(f"{name!r}: record {n + 1} is damaged ({e})") from None
            n += 1
            if seq != GAP_SEQ:
                yield Frame(ts, seq, topic, payload)
                continue
            try:
                gap = Gap.from_dict(msgspec.msgpack.decode(payload))
            except (msgspec.DecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{name!r}: record {n} is a damaged gap record ({e})") from None
            yield gap


def replay_recording(path: PathLike, follower=None, errors: Optional[list] = None):
    """Feed a recording through a StreamFollower; returns the follower. Its gaps are the recorder's
    (filled ones too), and the holes of a recording that has no gap records are found again."""
    follower = follower if follower is not None else StreamFollower()
    for entry in read_entries(path, errors):
        if not isinstance(entry, Frame):
            follower.expect_gap(entry)
            continue
        gap = follower.offer(entry.seq, entry.payload, entry.topic)
        if gap is not None:
            follower.resolve(gap, [])
    return follower
