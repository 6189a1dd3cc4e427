"""Which models a rebuild may load, and the one loaded model a server keeps.

A rebuild (POST /state/rebuild, admin only) may name 'default', the model being served, or a path
under the model roots (`--model-roots`; default: the model cache, and the served model's folder
when it was given as a path). Paths are resolved (symlinks, '..') before the check, and a path
outside the roots gets the same answer whether or not it exists, so a rebuild cannot be used to
probe the file system.

`RunnerCache` keeps only the model of the engine being served: after a rebuild onto another model
the old one is released (the old engine was its last holder), so three rebuilds do not hold
three models.
"""
from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
from typing import Iterable, Optional

from core import env
from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.server.errors import APIError


def default_roots(served_model: str) -> list[str]:
    roots = [str(env.model_cache())]
    if served_model != "default":
        path = os.path.realpath(os.path.expanduser(served_model))
        roots.append(path if os.path.isdir(path) else os.path.dirname(path))
    return roots


class ModelRoots:
    def __init__(self, roots: Iterable[str], served_model: str) -> None:
        self.roots = [os.path.realpath(os.path.expanduser(r)) for r in roots if r]
        self.served_model = served_model

    def check(self, model: object, current: Optional[str] = None) -> None:
        """400 unless `model` is 'default', the served or current model, or a path under a root."""
        if not isinstance(model, str) or not model.strip():
            raise APIError(400, f"model must be a non-empty string, got {model!r}", "model")
        if model in ("default", self.served_model, current):
            return
        try:
            path = os.path.realpath(os.path.expanduser(model))
        except ValueError:   # a NUL byte: no path at all, refused as any model outside the roots is
            path = ""
        if path and any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in self.roots):
            return
        raise APIError(400, f"model {model!r} is not one this server may load: a rebuild loads 'default', the "
                            f"served model, or a model under the server's model roots (--model-roots)", "model",
                       "model_not_allowed")


def settle_heap() -> None:
    """Collect, then freeze what is left (gc.freeze): the loaded model, transformers and the libraries are
    ~400k objects that live as long as the engine, and a full collection walked them all in ~240 ms (SmolLM2,
    this box) whenever enough new objects had piled up: a pause every decoding stream saw. Frozen, the
    collector never walks them again; young garbage is still collected as before."""
    gc.collect()
    gc.freeze()


def release_memory() -> None:
    """Collect what a dropped engine held (its model, its pool), hand cached GPU memory back, and (glibc)
    return the freed heap to the system, so the process shrinks instead of keeping it for later. The heap was
    frozen (settle_heap): unfrozen first, or the old engine's reference cycles would never be collected, then
    frozen again with the new engine in it."""
    gc.unfreeze()
    settle_heap()
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):    # not glibc (musl): nothing to trim
            pass


class RunnerCache:
    """Builds engines for `python -m core.server`, keeping the loaded model of the last engine built,
    so a rebuild that changes only the pool or a policy reloads nothing. The device is the config's, like
    every other setting: a rebuild onto another device loads the model there (and a device this machine
    lacks is refused by inputs.check_device), never reports one device while running on another."""

    def __init__(self) -> None:
        self.model: Optional[str] = None       # the model of the runner kept
        self.key: Optional[tuple] = None       # (model, device, model_impl, dtype, kv_cache_dtype, disable_cuda_graph)
        self.runner = None
        self.lock = threading.Lock()

    def __call__(self, config: EngineConfig) -> Engine:
        from core.engine import inputs

        key = (config.model, config.device, config.model_impl, config.dtype, config.kv_cache_dtype,
               config.disable_cuda_graph)
        with self.lock:
            runner = self.runner if key == self.key else None
        if runner is None:
            runner = inputs.load_model(config.model, config.device, config.model_impl, config.dtype,
                                       config.kv_cache_dtype, not config.disable_cuda_graph)
        engine = Engine(runner, config)      # may fail (pool too big): the cache keeps the old model
        with self.lock:
            self.model, self.key, self.runner = config.model, key, runner
        return engine
