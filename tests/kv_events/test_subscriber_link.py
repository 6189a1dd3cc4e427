"""The subscriber says what its socket saw: "refused" while nothing listens at a connected address
(the engine connects too: no one binds), "connected" once a publisher is there; with bind=True it
listens and an engine that connects (a named host, SGLang's rule) reaches it. `received` counts live
batches only."""
from __future__ import annotations

import socket
import time

import pytest

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.kv_events.publisher import KVEventPublisher, should_bind
from core.kv_events.subscriber import KVEventSubscriber


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline
        time.sleep(0.02)


def test_connecting_where_nothing_listens_is_refused_and_receives_nothing():
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{_free_port()}").start()
    try:
        assert sub.link == "connecting" or sub.link == "refused"
        _until(lambda: sub.link == "refused")
        assert sub.connect_retries >= 1 and sub.received == 0 and sub.follower.last_seq is None
    finally:
        sub.close()


def test_a_bound_subscriber_hears_an_engine_that_connects():
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    assert not should_bind(endpoint)
    sub = KVEventSubscriber(endpoint, bind=True).start()
    pub = KVEventPublisher(RadixCache(SlotAllocator(64, page_size=2), page_size=2), endpoint=endpoint, interval=3600)
    try:
        assert sub.link == "listening" or sub.link == "connected"
        _until(lambda: sub.link == "connected")
        # a connecting publisher's first batches can go out before its pipe to us is ready (ZMQ's slow
        # joiner): publish until one arrives, then the stream is followed batch by batch
        cache = pub.cache
        for i in range(1, 8):
            cache.insert(RadixKey([i, i]), cache.allocator.alloc(2))     # something new to publish
            seq = pub.flush()
            if sub.follower.wait_for(seq, 0.2):
                break
        assert sub.received >= 1 and sub.follower.last_seq == seq
        before = sub.received
        cache.insert(RadixKey([9, 9]), cache.allocator.alloc(2))
        seq = pub.flush()
        assert sub.follower.wait_for(seq, 5.0) and sub.received == before + 1
    finally:
        pub.close()
        sub.close()


def test_a_wildcard_is_refused_unless_binding():
    with pytest.raises(ValueError, match="is a bind address"):
        KVEventSubscriber("tcp://*:5557")
    sub = KVEventSubscriber(f"tcp://*:{_free_port()}", bind=True)
    try:
        assert sub.endpoint.startswith("tcp://0.0.0.0:") and sub.link == "listening"
    finally:
        sub.close()
