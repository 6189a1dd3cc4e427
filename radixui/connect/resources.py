"""What the app holds across reruns and tabs: one engine (in its own thread), the loaded models,
and the walkthrough. A rebuild that fails keeps the previous engine serving.

The engine and the clients are held here, in the process, not in st.cache_resource: Streamlit clears that
cache on any session's `clear_cache` message, which it handles without running the page (so before
app.py's origin check), and an engine dropped that way kept its thread and memory while the next visitor
built another. The models and the walkthrough stay cached there: clearing them costs a reload, not a leak."""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

import streamlit as st
import torch

from core import env
from core.engine.config import EngineConfig
from core.engine.model.runner import ModelRunner
from core.engine.walkthrough import WalkthroughStep, run_walkthrough
from radixui.connect.in_process import EngineHolder, InProcessClient

DEFAULT_MODEL = env.model()


def default_config() -> EngineConfig:
    """The in-process engine's first settings: the dashboard's demo scale (RADIX_POOL_SLOTS, RADIX_MODEL)."""
    return EngineConfig.dashboard(env.pool_slots()).replace(model=env.model())


def torch_threads() -> int:
    """Half the cores for torch: the page thread needs the other half to refresh on time (with every
    core in torch's pool, each parallel region waits for a core the page is using)."""
    return env.torch_threads() or max(1, (os.cpu_count() or 2) // 2)


@st.cache_resource(show_spinner="Loading the model (only the very first start on a machine also converts it, about 30 s)...")
def get_runner(model: str, impl: str = "auto", numerics: str = "auto") -> ModelRunner:
    torch.set_num_threads(torch_threads())
    return ModelRunner(model, impl=impl, numerics=numerics)


_held: dict[str, Any] = {}
_held_lock = threading.RLock()     # get_client makes the holder under it


def _once(name: str, make: Callable[[], Any]) -> Any:
    with _held_lock:
        if name not in _held:
            _held[name] = make()
        return _held[name]


def forget_clients() -> None:
    """Drop the clients (their next use reads RADIX_ENGINE_URL and the keys again) and stop this process's
    engine: for tests that start the app again with other settings."""
    with _held_lock:
        held = dict(_held)
        _held.clear()
    holder = held.get("holder")
    if holder is not None and holder.engine is not None:
        holder.engine.stop()


def get_holder() -> EngineHolder:
    return _once("holder", lambda: EngineHolder(lambda c: get_runner(c.model, c.model_impl, c.dtype),
                                                default_config))


@st.cache_resource(show_spinner="Running the article's four prompts through the model...")
def get_walkthrough(model: str, policy: str = "lru") -> list[WalkthroughStep]:
    return run_walkthrough(get_runner(model), eviction_policy=policy)


def engine_urls() -> list[str]:
    """$RADIX_ENGINE_URL as a list: one server, or several replicas separated by commas."""
    return env.engine_urls()


def get_client():
    """The engine the pages talk to: the (first) server in $RADIX_ENGINE_URL (HTTP), else one in this process."""
    def make():
        urls = engine_urls()
        if urls:
            from radixui.connect.http_client import HttpClient  # the server's client (core.server)
            return HttpClient(urls[0], api_key=env.api_key())
        return InProcessClient(get_holder())
    return _once("client", make)


def get_clients() -> list:
    """One client per replica in $RADIX_ENGINE_URL (the Replicas page); the Live page's engine otherwise."""
    def make():
        urls = engine_urls()
        if len(urls) <= 1:
            return [get_client()]
        from radixui.connect.http_client import HttpClient
        return [get_client()] + [HttpClient(u, api_key=env.api_key()) for u in urls[1:]]
    return _once("clients", make)
