"""One live KV event subscriber per dashboard process, swapped when the address changes.

Held by this module, so every tab and rerun reads the same rebuilt tree; the previous
subscriber is closed (its sockets and thread stopped) before a new address is followed.
"""
from __future__ import annotations

import threading
from typing import Optional

from core.kv_events.subscriber import KVEventSubscriber


class SourceHolder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: Optional[tuple] = None
        self.sub: Optional[KVEventSubscriber] = None

    def get(self, endpoint: str, replay: Optional[str], topic: str, bind: bool = False) -> KVEventSubscriber:
        """The subscriber for this address (`bind`: listen there, the engine connects); ValueError
        (old one kept) when the address is bad."""
        key = (endpoint, replay, topic, bind)
        with self.lock:
            if self.key != key:
                new = KVEventSubscriber(endpoint, topic=topic, replay_endpoint=replay, bind=bind)
                old, self.sub, self.key = self.sub, new.start(), key
                if old is not None:
                    old.close()
            return self.sub

    def close(self) -> None:
        with self.lock:
            if self.sub is not None:
                self.sub.close()
            self.sub, self.key = None, None


_holder = SourceHolder()


def get_holder() -> SourceHolder:
    """The process's one subscriber holder: not in st.cache_resource, which any session's clear_cache empties
    (the subscriber it held then kept its socket and thread, unclosed)."""
    return _holder


def get_source(endpoint: str, replay: Optional[str], topic: str,
               bind: bool = False) -> tuple[Optional[KVEventSubscriber], Optional[str]]:
    """(subscriber, None), or (None, error message saying what to change)."""
    try:
        return get_holder().get(endpoint, replay, topic, bind), None
    except ValueError as e:
        return None, str(e)
    except Exception as e:  # a ZMQ error for an address it cannot parse
        return None, f"cannot subscribe to {endpoint!r}: {type(e).__name__}: {e}; write it like tcp://HOST:5557"
