"""Subscribe to an engine's KV events: a ZMQ SUB socket, and its replay socket to fill gaps.

Frames are `[topic, seq (8 bytes, big-endian), payload]` as SGLang's and vLLM's
ZmqEventPublisher send them. When a sequence number is skipped (a slow subscriber, a PUB
high-water mark, joining after the engine started), the subscriber asks the publisher's ROUTER
replay socket for everything from the first missing seq: a DEALER sends `[b"", start seq]` and
reads `[b"", topic, seq, payload]` frames until the end marker (seq -1). The publisher answers
with every batch its buffer (the last `buffer_steps`) holds from that seq on: those are applied,
and what it no longer holds stays one unrecovered gap (follower.py), shown in the view. Each
range is asked for once: after a replay the follower is past it, lost part included.

Who binds: SGLang's publisher binds a wildcard host (tcp://*:5557) and connects to a named one
(tcp://HOST:5557). A subscriber connects by default; `bind=True` listens instead, for an engine
whose endpoint names this machine. `link` says what the socket saw (a socket monitor): "refused"
while nothing listens at a connected address, the case where both sides connect and nothing
ever arrives; `received` counts live batches (replayed ones are not).
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Optional

import zmq
from zmq.utils.monitor import recv_monitor_message

from core.kv_events.follower import Gap, StreamFollower
from core.kv_events.protocol import END_SEQ, DecodeError, seq_bytes, seq_from_bytes


def check_endpoint(endpoint: str, what: str = "endpoint", bind: bool = False) -> str:
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise ValueError(f"{what} {endpoint!r} is not a ZMQ address; write it like tcp://HOST:5557")
    scheme = endpoint.split("://", 1)[0]
    if scheme not in ("tcp", "ipc", "inproc"):
        raise ValueError(f"{what} {endpoint!r}: unsupported transport {scheme!r}; use tcp://, ipc:// or inproc://")
    if scheme == "tcp" and "*" in endpoint and not bind:
        raise ValueError(f"{what} {endpoint!r} is a bind address; a subscriber connects to the "
                         f"engine's host, e.g. tcp://127.0.0.1:5557")
    if scheme == "tcp":   # ZMQ itself takes port 99999 and raises a bare ZMQError for "tcp://"
        host, _, port = endpoint.split("://", 1)[1].rpartition(":")
        if not host or not (port == "*" or (port.isdigit() and 0 < int(port) < 65536)):
            raise ValueError(f"{what} {endpoint!r} needs a host and a port in 1-65535, e.g. tcp://127.0.0.1:5557")
    return endpoint


class KVEventSubscriber:
    """Follows one publisher in a background thread; read `follower` (under its lock) for views."""

    def __init__(self, endpoint: str, topic: str = "", replay_endpoint: Optional[str] = None,
                 follower: Optional[StreamFollower] = None, replay_timeout: float = 2.0,
                 context: Optional[zmq.Context] = None, bind: bool = False) -> None:
        self.endpoint = check_endpoint(endpoint, bind=bind)
        self.bind = bind
        self.replay_endpoint = None if not replay_endpoint else check_endpoint(replay_endpoint, "replay endpoint")
        if not isinstance(topic, str):
            raise ValueError(f"topic must be a string, got {topic!r}")
        self.topic = topic
        self.follower = follower if follower is not None else StreamFollower()
        self.replay_timeout = replay_timeout
        self.replays = 0
        self.errors: list[str] = []
        self._own_ctx = context is None
        self._ctx = context if context is not None else zmq.Context()
        self._stop = threading.Event()
        self._catch_up_lock = threading.Lock()
        self._caught_up = False
        self.catch_up_gap: Optional[Gap] = None
        self._thread: Optional[threading.Thread] = None
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self.received = 0                   # live batches (frames on the SUB socket)
        self.first_recv: Optional[float] = None
        self.started = time.time()
        self.connect_retries = 0
        self.link = "listening" if bind else "connecting"
        self._mon = self._sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED
                                                 | zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED)
        try:
            if bind:
                self._sub.bind(self.endpoint)
                self.endpoint = self._sub.getsockopt_string(zmq.LAST_ENDPOINT) or self.endpoint
            else:
                self._sub.connect(self.endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise ValueError(f"cannot {'bind' if bind else 'connect to'} {endpoint!r}: {e}; "
                             + ("bind an address of this machine (tcp://*:5557 or tcp://127.0.0.1:5557) on a free port"
                                if bind else "write it like tcp://HOST:5557")) from None

    # ----- lifecycle ------------------------------------------------------------------------
    def start(self, catch_up: bool = True) -> "KVEventSubscriber":
        """Follow in a thread; with a replay endpoint it first catches up from seq 0 (`catch_up`)."""
        if self._thread is None:
            self._catch_up_first = catch_up
            self._thread = threading.Thread(target=self._loop, name="kv-events-sub", daemon=True)
            # Ctrl-C held back while the thread starts: landing inside Thread.start() it left a thread that runs
            # but cannot be joined yet ("cannot join thread before it is started" from close()); delivered
            # right after, it finds the thread started. The thread inherits the mask, so Ctrl-C stays the
            # main thread's.
            held = hasattr(signal, "pthread_sigmask")
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if held else None
            try:
                self._thread.start()
            finally:
                if held:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.ident is not None:   # not when Ctrl-C beat its start
            self._thread.join(timeout)
            self._thread = None
        self._close_sockets()

    def _close_sockets(self) -> None:
        try:
            self._sub.disable_monitor()
        except zmq.ZMQError:
            pass
        self._mon.close(linger=0)
        self._sub.close(linger=0)
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> "KVEventSubscriber":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def catch_up(self) -> Optional[Gap]:
        """Ask the replay socket for everything from seq 0 once (right after connecting to a running
        engine): the tree starts complete, not mid-stream. Returns the "joined late" gap it filled.
        Done once per subscriber: `start()` does it in the thread, and a call from another thread
        waits for that one and returns its gap (two catch-ups would race each other and the live
        frames, and log the same gap twice)."""
        with self._catch_up_lock:
            if not self._caught_up:
                frames = self._replay(0) if self.replay_endpoint is not None else []
                self.catch_up_gap = self.follower.catch_up(frames)
                self._caught_up = True
            return self.catch_up_gap

    # ----- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        if self._catch_up_first:
            try:
                self.catch_up()
            except zmq.ZMQError as e:
                self.errors.append(f"catch-up: {e}")
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        poller.register(self._mon, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(50))
                if self._mon in ready:
                    self._on_monitor()
                if self._sub not in ready:
                    continue
                while not self._stop.is_set():
                    try:
                        frames = self._sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_frames(frames)
            except zmq.ZMQError as e:  # socket closed under us, or a transport error: note it, go on
                if self._stop.is_set():
                    break
                self.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.05)

    def _on_monitor(self) -> None:
        """Track the link: connected (or a publisher connected to us), refused (nothing listens), gone."""
        while True:
            try:
                ev = recv_monitor_message(self._mon, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if ev in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                self.link = "connected"
            elif ev == zmq.EVENT_CONNECT_RETRIED:
                self.connect_retries += 1
                self.link = "refused"
            elif ev == zmq.EVENT_DISCONNECTED:
                self.link = "listening" if self.bind else "disconnected"

    def _on_frames(self, frames: list) -> None:
        if len(frames) != 3:
            self.errors.append(f"ignored a message of {len(frames)} frames (expected topic, seq, payload)")
            return
        topic, raw_seq, payload = frames
        self.received += 1
        if self.first_recv is None:
            self.first_recv = time.time()
        try:
            seq = seq_from_bytes(raw_seq)
        except DecodeError as e:
            self.errors.append(str(e))
            return
        if seq < 0:   # -1 marks a gap in a recording and the end of a replay: never a batch
            self.errors.append(f"ignored a batch with sequence number {seq} (a publisher counts from 0)")
            return
        try:
            gap = self.follower.offer(seq, payload, topic)
            if gap is not None:
                self.follower.resolve(gap, self._replay(gap.start) if self.replay_endpoint else [])
        except Exception as e:   # whatever one batch holds, the thread keeps following (it died, silently)
            self.errors.append(f"seq {seq}: {type(e).__name__}: {e}")

    def _replay(self, start: int) -> list[tuple[int, bytes, bytes]]:
        """Everything the publisher's replay buffer holds from `start` on (empty on timeout)."""
        self.replays += 1
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        out: list[tuple[int, bytes, bytes]] = []
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart([b"", seq_bytes(start)])
            deadline = time.monotonic() + self.replay_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000) + 1):
                    self.errors.append(f"replay from seq {start}: no end marker within {self.replay_timeout:g} s "
                                       f"(is {self.replay_endpoint} the engine's replay_endpoint?)")
                    break
                msg = sock.recv_multipart()
                if len(msg) != 4:
                    continue
                _, topic, raw_seq, payload = msg
                try:
                    seq = seq_from_bytes(raw_seq)
                except DecodeError as e:
                    self.errors.append(f"replay from seq {start}: {e}")
                    continue
                if seq == END_SEQ:
                    break
                if seq < 0:
                    self.errors.append(f"replay from seq {start}: ignored a batch with sequence number {seq}")
                    continue
                out.append((seq, payload, topic))
        finally:
            sock.close(linger=0)
        return out
