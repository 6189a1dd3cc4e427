"""Issue 26, item 3: KV events carry prompts (token ids) to any subscriber, so the server publishes on
loopback unless told otherwise, and a bind beyond this machine prints a warning naming what goes out."""
from __future__ import annotations

import io
import socket

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache
from core.kv_events.publish_config import exposed_endpoints, parse_config, publisher_binds, warn_if_exposed
from core.kv_events.publisher import KVEventPublisher


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_default_endpoint_is_bound_on_loopback_only():
    cfg = parse_config('{"publisher": "zmq"}')
    assert cfg.endpoint == "tcp://127.0.0.1:5557" and publisher_binds(cfg)
    assert exposed_endpoints(cfg) == [] and warn_if_exposed(cfg, io.StringIO()) == []
    port = _free_port()
    cfg = parse_config(f'{{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:{port}"}}')
    with KVEventPublisher(RadixCache(SlotAllocator(16)), endpoint=cfg.endpoint, bind=publisher_binds(cfg)) as pub:
        assert pub.endpoint == f"tcp://127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=2):   # bound (listening), not connected out
            pass


def test_a_wildcard_bind_prints_a_warning_that_names_what_is_published():
    cfg = parse_config('{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://0.0.0.0:5558"}')
    out = io.StringIO()
    assert warn_if_exposed(cfg, out) == ["tcp://*:5557", "tcp://0.0.0.0:5558"]
    text = out.getvalue()
    assert text.startswith("warning: KV events bind tcp://*:5557, tcp://0.0.0.0:5558 (every interface)")
    for words in ("unauthenticated", "token ids", "prompts and outputs", "tokenizer", "tcp://127.0.0.1"):
        assert words in text, words


def test_loopback_ipc_and_outbound_connections_are_not_warned_about():
    for config in ('{"publisher": "zmq", "endpoint": "tcp://localhost:5557", "replay_endpoint": "tcp://[::1]:5558"}',
                   '{"publisher": "zmq", "endpoint": "ipc:///tmp/kv.sock"}',
                   '{"publisher": "zmq", "endpoint": "tcp://router.lan:5557", "bind": false}',
                   '{"publisher": "null", "endpoint": "tcp://*:5557"}'):
        assert exposed_endpoints(parse_config(config)) == [], config
    routable = parse_config('{"publisher": "zmq", "endpoint": "tcp://192.168.1.20:5557", "bind": true}')
    assert exposed_endpoints(routable) == ["tcp://192.168.1.20:5557"]
    # "bind": false on a loopback address connects out, as SGLang does
    assert not publisher_binds(parse_config('{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:1", "bind": false}'))
