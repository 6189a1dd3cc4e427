"""Publish our radix cache's changes as SGLang publishes its own: KV events over ZMQ.

A thread follows the cache's event log (core/cache/events.py) and turns each new slice into one
`KVEventBatch`: an insert becomes BlockStored (one block per page, chained on the parent's last
page), an eviction BlockRemoved, a reset AllBlocksCleared. A split changes no block (nodes hold
whole pages, so both halves keep their pages and hashes); it only moves hashes in our mirror.
Consecutive stores that continue one chain, and consecutive removals, coalesce as SGLang's
KVCacheEventRecorder does. Frames and the replay ROUTER follow ZmqEventPublisher exactly.

A key's extra_key is published as SGLang's / vLLM's `cache_salt` (hashing.py says why): SGLang
events carry it in BlockStored.cache_salt, vLLM events as the first block's extra key. With
`"hash": "vllm"` the events are vLLM 0.33's, field for field (lora_id, medium, lora_name always
sent, group_idx 0, extra_keys one entry per block, one BlockRemoved per block) so vLLM's own
decoder reads them. The
socket is an XPUB rather than a PUB: the same wire to every SUB, but it hands us each
subscription, so `wait_for_subscribers` can tell when a subscriber really hears the next batch
(a PUB drops what it sends before a SUB's subscription reached it, and nothing says when that is).

If the log ring has dropped events the thread never read (it fell more than `event_capacity`
events behind), it resyncs: AllBlocksCleared, then the whole tree from a snapshot.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Optional

import zmq

from core.kv_events.hashing import BlockHasher
from core.kv_events.protocol import (MEDIUM_GPU, AllBlocksCleared, SGLangBlockRemoved, SGLangBlockStored,
                                     SGLangKVEventBatch, VLLMBlockRemoved, VLLMBlockStored, VLLMKVEventBatch,
                                     encode_batch, seq_bytes, seq_from_bytes)
from core.observe.snapshot import snapshot_cache

_BIND_HOSTS = ("*", "0.0.0.0", "::")


def should_bind(endpoint: str) -> bool:
    """SGLang's rule: bind wildcard hosts, ipc and inproc; connect to a named host. Port 0 (let
    the OS pick) can only be bound."""
    return (any(h in endpoint for h in _BIND_HOSTS) or endpoint.startswith(("ipc://", "inproc://"))
            or endpoint.endswith(":0"))


class _Mirror:
    """Per live node: (page digests, published hashes, extra_key), to hash children and removals."""

    def __init__(self) -> None:
        self.nodes: dict[int, tuple[list, list, Optional[str]]] = {}


# loopback: events carry every prompt's token ids to any subscriber, without a key (publish wider on purpose)
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"


class KVEventPublisher:
    def __init__(self, cache, snapshot: Optional[Callable] = None, endpoint: str = DEFAULT_ENDPOINT,
                 replay_endpoint: Optional[str] = None, topic: str = "", buffer_steps: int = 10_000,
                 hwm: int = 100_000, bind: Optional[bool] = None, hash_scheme: str = "sglang",
                 interval: float = 0.02, dp_rank: int = 0, context: Optional[zmq.Context] = None,
                 fmt: str = "default") -> None:
        """`cache`: a RadixCache (its `events` log is followed). `snapshot`: returns a consistent
        CacheSnapshot (Engine.snapshot().cache, taken under the engine's lock); default
        snapshot_cache(cache), for a cache no other thread mutates. `fmt`: SGLang's "default" or
        "dynamo" event format (dynamo maps salted hashes through SGLang's namespace seed)."""
        if not cache.events.enabled:
            raise ValueError("the cache records no events (record_events=False); KV events are made "
                             "from its event log: build the cache with record_events=True")
        self.cache = cache
        self.page_size = cache.page_size
        self.hasher = BlockHasher(self.page_size, hash_scheme, fmt)
        self.vllm = hash_scheme == "vllm"
        self._snapshot = snapshot or (lambda: snapshot_cache(cache))
        self.topic = topic.encode("utf-8")
        self.interval = interval
        self.dp_rank = dp_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self.batches_sent = 0
        self.drop_next = 0            # test hook: buffer but do not send the next N batches (a lost message)
        self.errors: list[str] = []
        self._own_ctx = context is None
        self._ctx = context if context is not None else zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)   # every subscription, not only a topic's first
        self.subscriptions = 0        # subscribe messages seen (one per SUB connection and topic)
        self._pub.set_hwm(hwm)
        self._replay = None
        try:
            if should_bind(endpoint) if bind is None else bind:
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint
            self.replay_endpoint = None
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self._replay.bind(replay_endpoint)
                self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise ValueError(f"cannot open KV event sockets ({endpoint}, replay {replay_endpoint}): {e}; "
                             f"pick a free port or another address") from None
        self._mirror = _Mirror()
        self._cv = threading.Condition()
        self._wanted = 0
        self._done = 0
        self._stop = threading.Event()
        self._resync_pending = True   # the first batch: AllBlocksCleared + the tree as it is
        self._last_event = cache.events.last_seq
        self._thread = threading.Thread(target=self._loop, name="kv-events-pub", daemon=True)
        self._thread.start()

    # ----- public ---------------------------------------------------------------------------------
    @property
    def last_seq(self) -> int:
        """Sequence number of the latest batch published (-1 before the first)."""
        return self._seq - 1

    def flush(self, timeout: float = 5.0) -> int:
        """Publish everything the cache logged so far; returns the last batch seq (tests, shutdown)."""
        with self._cv:
            self._wanted += 1
            want = self._wanted
            self._cv.notify_all()
            end = time.monotonic() + timeout
            while self._done < want:
                left = end - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    raise TimeoutError(f"the KV event publisher did not flush within {timeout:g} s")
                self._cv.wait(left)
        return self.last_seq

    def wait_for_subscribers(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until `count` subscriptions have reached the socket: every batch sent after that
        reaches those subscribers (start a scenario, a test, a recording after it). False on timeout."""
        end = time.monotonic() + timeout
        with self._cv:
            while self.subscriptions < count:
                left = end - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cv.wait(min(left, 0.05))
            return True

    def close(self) -> None:
        if self._stop.is_set():
            return
        try:
            if self._thread.is_alive():
                self.flush(timeout=2.0)
        except TimeoutError:
            pass
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        self._thread.join(5.0)
        self._close_sockets()

    def __enter__(self) -> "KVEventPublisher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- thread ------------------------------------------------------------------------------------
    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        if self._own_ctx:
            self._ctx.term()

    def _loop(self) -> None:
        """Serve replay requests every 50 ms at least; publish every `interval` s, or at once on flush()."""
        next_publish = 0.0
        while not self._stop.is_set():
            with self._cv:
                if self._done >= self._wanted:
                    self._cv.wait(max(0.0, min(0.05, next_publish - time.monotonic())))
                want = self._wanted
            try:
                self._read_subscriptions()
                self._serve_replay()
                if want > self._done or time.monotonic() >= next_publish:
                    next_publish = time.monotonic() + self.interval
                    self._publish_pending()
            except Exception as e:  # never let the thread die: record it, start over from the tree
                self.errors.append(f"{type(e).__name__}: {e}")
                self._resync_pending = True   # a half-converted slice must not leave subscribers wrong
                time.sleep(0.05)
            with self._cv:
                self._done = max(self._done, want)
                self._cv.notify_all()

    def _read_subscriptions(self) -> None:
        """Count the SUBs' subscribe messages (b"\x01" + topic); unsubscribes change nothing."""
        seen = 0
        while self._pub.poll(0):
            msg = self._pub.recv()
            seen += msg[:1] == b"\x01"
        if seen:
            with self._cv:
                self.subscriptions += seen
                self._cv.notify_all()

    def _serve_replay(self) -> None:
        while self._replay is not None and self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, raw = frames
            try:
                start = seq_from_bytes(raw)
            except ValueError:
                continue
            for seq, payload in self._buffer:
                if seq >= start:
                    self._replay.send_multipart([client, b"", self.topic, seq_bytes(seq), payload])
            self._replay.send_multipart([client, b"", b"", seq_bytes(-1), b""])

    def _publish_pending(self) -> None:
        events = self.cache.events.since(self._last_event)
        out: list = []
        if self._resync_pending or (events and events[0].seq != self._last_event + 1):
            self._resync_pending = False
            out = self._resync()
            events = self.cache.events.since(self._last_event)
        for ev in events:
            try:
                self._convert(ev, out)
            except KeyError:  # a node the mirror never saw: start over from the tree itself
                self.errors.append(f"event {ev.seq} ({ev.kind}) names a node the publisher never saw; resyncing")
                self._resync_pending = True
                break
            self._last_event = ev.seq
        if out:
            batch = (VLLMKVEventBatch(ts=time.time(), events=out, data_parallel_rank=self.dp_rank) if self.vllm
                     else SGLangKVEventBatch(ts=time.time(), events=out, attn_dp_rank=self.dp_rank))
            self._send(batch)

    def _send(self, batch) -> None:
        payload = encode_batch(batch)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        if self.drop_next > 0:
            self.drop_next -= 1
            return
        self._pub.send_multipart([self.topic, seq_bytes(seq), payload])
        self.batches_sent += 1

    # ----- events -> KV events -----------------------------------------------------------------
    def _resync(self) -> list:
        snap = self._snapshot()
        self._mirror.nodes.clear()
        self._last_event = snap.seq
        out: list = [AllBlocksCleared()]
        for n in snap.nodes:
            if n.parent is None:
                continue
            self._store(n.id, n.parent, n.token_ids, n.extra_key, out)
        return out

    def _convert(self, ev, out: list) -> None:
        kind = ev.kind
        if kind == "insert":
            self._store(ev.node, ev.parent, ev.token_ids, ev.extra_key, out)
        elif kind == "split":
            digests, hashes, extra = self._mirror.nodes[ev.node]
            pages = ev.position // self.page_size
            self._mirror.nodes[ev.new_parent] = (digests[:pages], hashes[:pages], extra)
            self._mirror.nodes[ev.node] = (digests[pages:], hashes[pages:], extra)
        elif kind == "evict":
            entry = self._mirror.nodes.pop(ev.node, None)
            if entry is not None and entry[1]:
                self._removed(out, list(entry[1]))
        elif kind == "reset":
            self._mirror.nodes.clear()
            self._enqueue(out, AllBlocksCleared())

    def _store(self, node: int, parent: int, token_ids, salt: Optional[str], out: list) -> None:
        up = self._mirror.nodes.get(parent)
        prior = up[0][-1] if up and up[0] else None
        parent_hash = up[1][-1] if up and up[1] else None
        if up is not None:
            salt = up[2]
        digests, hashes = self.hasher.chain(prior, token_ids, salt)
        self._mirror.nodes[node] = (digests, hashes, salt)
        ps = self.page_size
        for i, h in enumerate(hashes):
            tokens = list(token_ids[i * ps:(i + 1) * ps])
            if self.vllm:   # vLLM hashes the salt into a request's first block only, and says so there
                first = prior is None and i == 0 and salt is not None
                ev = VLLMBlockStored(block_hashes=[h], parent_block_hash=parent_hash, token_ids=tokens, block_size=ps,
                                     lora_id=None, medium=MEDIUM_GPU, lora_name=None,
                                     extra_keys=[(salt,) if first else None], group_idx=0)
            else:
                ev = SGLangBlockStored(block_hashes=[h], parent_block_hash=parent_hash, token_ids=tokens,
                                       block_size=ps, lora_id=None, medium=MEDIUM_GPU, cache_salt=salt)
            self._enqueue(out, ev)
            parent_hash = h

    def _removed(self, out: list, hashes: list) -> None:
        if self.vllm:   # vLLM frees blocks one by one: one BlockRemoved each
            out.extend(VLLMBlockRemoved(block_hashes=[h], medium=MEDIUM_GPU, group_idx=0) for h in hashes)
        else:
            self._enqueue(out, SGLangBlockRemoved(block_hashes=hashes, medium=MEDIUM_GPU))

    @staticmethod
    def _enqueue(out: list, ev) -> None:
        """SGLang's coalescing: a store continuing the previous store's chain (same tier, block size,
        LoRA and salt), or a removal after a removal in the same tier, joins it."""
        if out:
            tail = out[-1]
            if isinstance(tail, SGLangBlockRemoved) and isinstance(ev, SGLangBlockRemoved) and tail.medium == ev.medium:
                tail.block_hashes.extend(ev.block_hashes)
                return
            if (type(tail) is type(ev) and isinstance(ev, (SGLangBlockStored, VLLMBlockStored))
                    and tail.medium == ev.medium and tail.block_size == ev.block_size and tail.lora_id == ev.lora_id
                    and tail.lora_name == ev.lora_name and getattr(tail, "cache_salt", None) == getattr(ev, "cache_salt", None)
                    and tail.block_hashes and ev.parent_block_hash == tail.block_hashes[-1]):
                tail.block_hashes.extend(ev.block_hashes)
                tail.token_ids.extend(ev.token_ids)
                if isinstance(ev, VLLMBlockStored):
                    tail.extra_keys.extend(ev.extra_keys)
                return
        out.append(ev)
