"""`--kv-events-config` as SGLang takes it, and `attach_publisher(engine, config_json)` for the server.

Same JSON shape as SGLang's KVEventsConfig (sglang/srt/disaggregation/kv_events.py):
    {"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558",
     "topic": "", "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000,
     "bind": null, "format": "default"}
plus one field of ours, "hash": "sglang" (default) or "vllm", the block hash scheme.
`max_queue_size` is accepted for compatibility (we read the cache's log, not a queue); `format`
"dynamo" maps salted block hashes through SGLang's namespace seed, as SGLang does (hashing.py).

The events carry every cached block's token ids (prompts and outputs, which any copy of the
model's tokenizer decodes) to any subscriber, with no authentication. So the endpoint defaults to
loopback (SGLang's default is `tcp://*:5557`), and binding beyond this machine (`tcp://*:...`,
`0.0.0.0`, a routable address) prints a warning that says so; put such a socket only on a network
where everyone who can reach it may read every prompt. A loopback endpoint is bound unless the
config says `"bind": false` (SGLang would connect to it).
"""
from __future__ import annotations

import ipaddress
import sys
from typing import Literal, Optional, TextIO

import msgspec

from core.kv_events.hashing import SCHEMES
from core.kv_events.publisher import DEFAULT_ENDPOINT


class KVEventsConfig(msgspec.Struct, forbid_unknown_fields=True):
    publisher: str = "null"
    endpoint: str = DEFAULT_ENDPOINT
    bind: Optional[bool] = None
    replay_endpoint: Optional[str] = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    format: Literal["default", "dynamo"] = "default"
    hash: str = "sglang"


def parse_config(config_json: str) -> KVEventsConfig:
    """Parse and check a --kv-events-config value; ValueError says what to change."""
    if not isinstance(config_json, (str, bytes)) or not str(config_json).strip():
        raise ValueError("--kv-events-config needs a JSON object, e.g. "
                         "'{\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}'")
    try:
        cfg = msgspec.json.decode(config_json, type=KVEventsConfig)
    except msgspec.ValidationError as e:
        raise ValueError(f"--kv-events-config: {e} (fields: publisher, endpoint, bind, replay_endpoint, "
                         f"buffer_steps, hwm, max_queue_size, topic, format, hash)") from None
    except msgspec.DecodeError as e:
        raise ValueError(f"--kv-events-config is not valid JSON ({e}); pass one JSON object") from None
    if cfg.publisher not in ("null", "zmq"):
        raise ValueError(f"--kv-events-config: unknown publisher {cfg.publisher!r}; use \"zmq\" (or \"null\" for off)")
    for name in ("buffer_steps", "hwm", "max_queue_size"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--kv-events-config: {name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.hash not in SCHEMES:
        raise ValueError(f"--kv-events-config: hash must be one of {', '.join(SCHEMES)}, got {cfg.hash!r}")
    for name in ("endpoint", "replay_endpoint"):
        v = getattr(cfg, name)
        if v is not None and "://" not in v:
            raise ValueError(f"--kv-events-config: {name} {v!r} is not a ZMQ address; write it like tcp://*:5557")
    if cfg.replay_endpoint is not None and cfg.replay_endpoint == cfg.endpoint and not cfg.endpoint.endswith(":0"):
        raise ValueError("--kv-events-config: replay_endpoint must differ from endpoint (e.g. port 5558)")
    return cfg


def _host(endpoint: str) -> str:
    return endpoint.split("://", 1)[1].rsplit(":", 1)[0].split(";")[-1].strip("[]")


def is_loopback(endpoint: str) -> bool:
    """ipc:// and inproc:// (this machine's), or tcp to localhost / a loopback address."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = _host(endpoint) if "://" in endpoint else ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def publisher_binds(cfg: KVEventsConfig) -> bool:
    """Whether the publisher binds its endpoint: "bind" when given; else SGLang's rule (wildcards, ipc,
    port 0), and a loopback address binds too (the default endpoint; SGLang would connect to it)."""
    from core.kv_events.publisher import should_bind
    if cfg.bind is not None:
        return cfg.bind
    return should_bind(cfg.endpoint) or is_loopback(cfg.endpoint)


def exposed_endpoints(cfg: KVEventsConfig) -> list[str]:
    """The endpoints this config binds beyond loopback (a wildcard, a routable address or name)."""
    if cfg.publisher == "null":
        return []
    bound = ([cfg.endpoint] if publisher_binds(cfg) else []) + [e for e in (cfg.replay_endpoint,) if e]
    return [e for e in bound if not is_loopback(e)]


def warn_if_exposed(cfg: KVEventsConfig, out: Optional[TextIO] = None) -> list[str]:
    """Print one warning naming what a non-loopback bind publishes; returns the exposed endpoints."""
    exposed = exposed_endpoints(cfg)
    if exposed:
        every = any(_host(e) in ("*", "0.0.0.0", "::", "") for e in exposed)
        print(f"warning: KV events bind {', '.join(exposed)}{' (every interface)' if every else ''}: anyone who "
              f"reaches {'them' if len(exposed) > 1 else 'it'} receives, unauthenticated, every cached block's token "
              f"ids (prompts and outputs, decodable with the model's tokenizer), block hashes, namespaces "
              f"(cache_salt / extra_key) and the cache's evictions; bind tcp://127.0.0.1:PORT unless everyone on "
              f"that network may read every prompt", file=out or sys.stderr, flush=True)
    return exposed


def attach_publisher(engine, config_json: str, interval: float = 0.02):
    """Start publishing `engine`'s radix cache as KV events; returns the publisher (call `.close()`
    at shutdown) or None when the config says publisher "null". A non-loopback bind is warned about."""
    from core.kv_events.publisher import KVEventPublisher
    cfg = parse_config(config_json)
    if cfg.publisher == "null":
        return None
    warn_if_exposed(cfg)
    return KVEventPublisher(engine.cache, snapshot=lambda: engine.snapshot().cache, endpoint=cfg.endpoint,
                            replay_endpoint=cfg.replay_endpoint, topic=cfg.topic, buffer_steps=cfg.buffer_steps,
                            hwm=cfg.hwm, bind=publisher_binds(cfg), hash_scheme=cfg.hash, interval=interval,
                            fmt=cfg.format)
