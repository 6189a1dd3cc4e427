"""`--kv-events-config` as SGLang takes it, and `attach_publisher(engine, config_json)` for the server.

Same JSON shape as SGLang's KVEventsConfig (sglang/srt/disaggregation/kv_events.py):
    {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
     "topic": "", "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000,
     "bind": null, "format": "default"}
plus one field of ours, "hash": "sglang" (default) or "vllm", the block hash scheme.
`max_queue_size` is accepted for compatibility (we read the cache's log, not a queue); `format`
"dynamo" maps salted block hashes through SGLang's namespace seed, as SGLang does (hashing.py).
"""
from __future__ import annotations

from typing import Literal, Optional

import msgspec

from core.kv_events.hashing import SCHEMES


class KVEventsConfig(msgspec.Struct, forbid_unknown_fields=True):
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
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


def attach_publisher(engine, config_json: str, interval: float = 0.02):
    """Start publishing `engine`'s radix cache as KV events; returns the publisher (call `.close()`
    at shutdown) or None when the config says publisher "null"."""
    from core.kv_events.publisher import KVEventPublisher
    cfg = parse_config(config_json)
    if cfg.publisher == "null":
        return None
    return KVEventPublisher(engine.cache, snapshot=lambda: engine.snapshot().cache, endpoint=cfg.endpoint,
                            replay_endpoint=cfg.replay_endpoint, topic=cfg.topic, buffer_steps=cfg.buffer_steps,
                            hwm=cfg.hwm, bind=cfg.bind, hash_scheme=cfg.hash, interval=interval, fmt=cfg.format)
