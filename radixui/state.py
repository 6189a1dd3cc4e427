"""What the app holds across reruns and tabs: one engine (in its own thread), the loaded models,
and the walkthrough. A rebuild that fails keeps the previous engine serving."""
from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass, replace
from typing import Optional

import streamlit as st
import torch

from core.engine import Engine
from core.model import ModelRunner
from core.walkthrough import WalkthroughStep, run_walkthrough

DEFAULT_MODEL = os.environ.get("RADIX_MODEL", "default")
DEFAULT_POOL_SLOTS = int(os.environ.get("RADIX_POOL_SLOTS", "1024"))  # a small pool shows eviction sooner


@dataclass(frozen=True)
class EngineConfig:
    model: str = DEFAULT_MODEL
    pool_slots: int = DEFAULT_POOL_SLOTS
    page_size: int = 1
    eviction_policy: str = "lru"
    schedule_policy: str = "lpm"
    max_running_requests: int = 16
    max_prefill_tokens: int = 1024
    disable_radix_cache: bool = False


def torch_threads() -> int:
    """Half the cores for torch: the page thread needs the other half to refresh on time (with every
    core in torch's pool, each parallel region waits for a core the page is using)."""
    return int(os.environ.get("RADIX_TORCH_THREADS", max(1, (os.cpu_count() or 2) // 2)))


@st.cache_resource(show_spinner="Loading the model (the first start converts it once, about 30 s)...")
def get_runner(model: str) -> ModelRunner:
    torch.set_num_threads(torch_threads())
    return ModelRunner(model)


class EngineHolder:
    """The live engine and its config; `rebuild` swaps engines only when the new one loads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.config: Optional[EngineConfig] = None
        self.engine: Optional[Engine] = None

    def get(self) -> Engine:
        with self.lock:
            if self.engine is None:
                self._build(EngineConfig())
            return self.engine

    def rebuild(self, config: EngineConfig) -> Optional[str]:
        """Returns an error message (and keeps the old engine) when `config` does not work."""
        with self.lock:
            try:
                self._build(config)
            except ValueError as exc:
                return str(exc)
            except Exception as exc:  # a model that fails to load in some other way
                return f"could not load {config.model!r}: {type(exc).__name__}: {exc}"
            return None

    def _build(self, config: EngineConfig) -> None:
        kwargs = asdict(config)
        runner = get_runner(kwargs.pop("model"))
        engine = Engine(runner, **kwargs)
        old, self.engine, self.config = self.engine, engine, config
        engine.start()
        if old is not None:
            old.stop()


@st.cache_resource
def get_holder() -> EngineHolder:
    return EngineHolder()


@st.cache_resource(show_spinner="Running the article's four prompts through the model...")
def get_walkthrough(model: str, policy: str = "lru") -> list[WalkthroughStep]:
    return run_walkthrough(get_runner(model), eviction_policy=policy)


def with_changes(config: EngineConfig, **changes) -> EngineConfig:
    return replace(config, **changes)


ENGINE_URL_ENV = "RADIX_ENGINE_URL"


def engine_urls() -> list[str]:
    """$RADIX_ENGINE_URL as a list: one server, or several replicas separated by commas."""
    return [u.strip() for u in os.environ.get(ENGINE_URL_ENV, "").split(",") if u.strip()]


@st.cache_resource
def get_client():
    """The engine the pages talk to: the (first) server in $RADIX_ENGINE_URL (HTTP), else one in this process."""
    from radixui.client import InProcessClient
    urls = engine_urls()
    if urls:
        from radixui.http_client import HttpClient  # the server's client (core.server)
        return HttpClient(urls[0], api_key=os.environ.get("RADIX_API_KEY") or None)
    return InProcessClient(get_holder())


@st.cache_resource
def get_clients() -> list:
    """One client per replica in $RADIX_ENGINE_URL (the Replicas page); the Live page's engine otherwise."""
    urls = engine_urls()
    if len(urls) <= 1:
        return [get_client()]
    from radixui.http_client import HttpClient
    return [get_client()] + [HttpClient(u, api_key=os.environ.get("RADIX_API_KEY") or None) for u in urls[1:]]
