"""Every RADIX_* environment variable, read here and nowhere else (the README lists them all).

Each is read when asked for, not at import, so a test or a launcher can set one and the next call
sees it. A malformed value is a ValueError that names the variable and what to write instead.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

VARIABLES: dict[str, str] = {
    "RADIX_MODEL": "model to serve: 'default' (SmolLM2-135M-Instruct), a local HF folder or a .gguf file",
    "RADIX_MODEL_CACHE": "where converted models live (default ~/.cache/radixattention/models)",
    "RADIX_POOL_SLOTS": "KV pool size of `make run`'s engine (default 1024; 160 evicts within a few prompts)",
    "RADIX_TORCH_THREADS": "torch threads of an engine in the dashboard's process (default: half the cores)",
    "RADIX_ENGINE_URL": "the dashboard attaches to this server (several, comma-separated: the Replicas page)",
    "RADIX_API_KEY": "the inference key the dashboard (and `python -m core.server`) uses",
    "RADIX_ADMIN_KEY": "the admin key the dashboard (and `python -m core.server`) uses",
    "RADIX_KV_EVENTS": "the KV events page's endpoint (an engine's ZMQ PUB socket, tcp://HOST:5557)",
    "RADIX_KV_EVENTS_REPLAY": "the KV events page's replay endpoint (tcp://HOST:5558)",
    "RADIX_KV_EVENTS_TOPIC": "the KV events page's topic",
    "RADIX_NATIVE_KERNELS": "0 turns off the native path's C kernels (their torch fallbacks run instead)",
    "RADIX_TEST_DEVICE": "the device the tests put the engine on (scripts/gpu_check.sh sets cuda)",
}


def _get(name: str) -> Optional[str]:
    assert name in VARIABLES, f"{name} is not listed in core.env.VARIABLES"
    value = os.environ.get(name, "").strip()
    return value or None


def _positive_int(name: str) -> Optional[int]:
    raw = _get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={raw!r} is not a positive whole number; set it to e.g. 1024, or unset it")
    return value


def model() -> str:
    return _get("RADIX_MODEL") or "default"


def model_cache() -> Path:
    raw = _get("RADIX_MODEL_CACHE")
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "radixattention" / "models"


def pool_slots() -> Optional[int]:
    return _positive_int("RADIX_POOL_SLOTS")


def torch_threads() -> Optional[int]:
    return _positive_int("RADIX_TORCH_THREADS")


def engine_urls() -> list[str]:
    """One server, or several replicas separated by commas; [] runs an engine in the dashboard's process."""
    return [u.strip() for u in (_get("RADIX_ENGINE_URL") or "").split(",") if u.strip()]


def api_keys() -> list[str]:
    """The inference keys: one, or several tenants' separated by commas."""
    return [k.strip() for k in (_get("RADIX_API_KEY") or "").split(",") if k.strip()]


def api_key() -> Optional[str]:
    """The key a client of the server sends (the dashboard, the router): the first of RADIX_API_KEY's."""
    keys = api_keys()
    return keys[0] if keys else None


def admin_key() -> Optional[str]:
    return _get("RADIX_ADMIN_KEY")


def kv_events() -> tuple[str, str, str]:
    """(endpoint, replay endpoint, topic) of the KV events page, '' where unset."""
    return (_get("RADIX_KV_EVENTS") or "", _get("RADIX_KV_EVENTS_REPLAY") or "", _get("RADIX_KV_EVENTS_TOPIC") or "")


def test_device() -> str:
    return _get("RADIX_TEST_DEVICE") or "cpu"


def native_kernels() -> bool:
    """False when RADIX_NATIVE_KERNELS=0: the native model path uses its torch fallbacks, not its C kernels."""
    return _get("RADIX_NATIVE_KERNELS") != "0"
