"""EngineHost: the one engine a server serves, what it has in flight, and its rebuilds.

Every request the server submits (OpenAI routes and the dashboard's) goes through `submit`,
which starts a watcher thread that drains the request's `RequestHandle.stream()` (a blocking
queue) and hands pieces to a callback (the routes hop them onto the event loop with
`call_soon_threadsafe`). One thread per request keeps the engine's API untouched and never
parks a blocking wait on the event loop or on asyncio's small default executor.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.request import Completion, RequestHandle
from core.engine.sampling import SamplingParams
from core.server.errors import APIError
from core.server.prometheus import ServerMetrics

EngineFactory = Callable[[EngineConfig], Engine]
OnPiece = Optional[Callable[[str], None]]
OnDone = Optional[Callable[[Optional[Completion]], None]]


class EngineHost:
    def __init__(self, engine: Engine, factory: Optional[EngineFactory] = None, model: str = "default",
                 served_model_name: Optional[str] = None, max_queue_requests: int = 256,
                 kv_events_config: Optional[str] = None) -> None:
        self.engine = engine
        self.kv_events_config = kv_events_config
        self.kv_publisher = self._publish(engine)     # a bad config raises ValueError before serving
        self.factory = factory
        self.model = model
        self._served_name = served_model_name
        self.max_queue_requests = max_queue_requests
        self._lock = threading.RLock()
        self.inflight: dict[str, RequestHandle] = {}
        self._rebuilding = False
        self.generation = 0          # bumps on rebuild and flush: part of version()
        self.metrics = ServerMetrics(self)

    @property
    def served_model_name(self) -> str:
        return self._served_name or self.model

    def config(self) -> dict[str, Any]:
        """The served engine's settings (EngineConfig as a dict), under the model name it was asked for."""
        return {**self.engine.config.as_dict(), "model": self.model}

    def version(self) -> int:
        e = self.engine
        return hash((id(e), self.generation, e.version()))

    def _publish(self, engine: Engine):
        """KV cache events of `engine` on ZMQ (--kv-events-config, SGLang's JSON), or None."""
        if not self.kv_events_config:
            return None
        from core.kv_events.publish_config import attach_publisher
        return attach_publisher(engine, self.kv_events_config)

    # ----- requests ----------------------------------------------------------------------------
    def submit(self, prompt: Any, params: SamplingParams, extra_key: Optional[str] = None,
               on_piece: OnPiece = None, on_done: OnDone = None) -> RequestHandle:
        """Queue on the engine (ValueError: the engine's verdict on the input), or 503 when full."""
        with self._lock:
            if self._rebuilding:
                raise APIError(503, "the engine is being rebuilt with new settings; retry in a few seconds")
            if len(self.inflight) >= self.max_queue_requests:
                raise APIError(503, f"the server has {len(self.inflight)} requests in flight, its limit "
                                    f"(--max-queue-requests {self.max_queue_requests}); retry later")
            engine = self.engine
            handle = engine.submit(prompt, params, extra_key=extra_key)
            self.inflight[handle.rid] = handle
        threading.Thread(target=self._watch, args=(handle, on_piece, on_done), daemon=True,
                         name=f"radix-watch-{handle.rid}").start()
        return handle

    def _watch(self, handle: RequestHandle, on_piece: OnPiece, on_done: OnDone) -> None:
        completion: Optional[Completion] = None
        try:
            for piece in handle.stream():
                if on_piece is not None:
                    on_piece(piece)
            completion = handle.result()
        finally:
            with self._lock:
                self.inflight.pop(handle.rid, None)
            if completion is not None:
                self.metrics.on_finish(completion)   # before on_done: a client that has its answer sees it counted
            if on_done is not None:
                on_done(completion)

    def abort(self, rid: str) -> bool:
        return self.engine.abort(rid)

    def abort_all(self) -> None:
        for rid in list(self.inflight):
            self.engine.abort(rid)

    # ----- control -----------------------------------------------------------------------------
    def flush_cache(self) -> None:
        """Empty the tree; 409 while anything is in flight, and 200 only when every slot is free."""
        with self._lock:
            if self.inflight:
                raise APIError(409, f"{len(self.inflight)} request(s) are in flight; wait for them to finish "
                                    f"(or abort them) before flushing the cache")
            self.metrics.sync_evictions()
            try:
                self.engine.reset_cache()
            except ValueError as exc:
                raise APIError(409, str(exc)) from exc
            a = self.engine.allocator
            if a.available() != a.num_slots:
                raise APIError(409, f"the cache is not empty after the flush ({a.num_slots - a.available()} slots "
                                    f"still held); retry when the engine is idle")
            self.generation += 1

    def rebuild(self, changes: dict[str, Any]) -> None:
        """Swap in an engine built from the current settings with `changes` (EngineConfig names); the old
        one keeps serving if the new one fails to build (ValueError -> 400, anything else -> 400 with its type)."""
        if self.factory is None:
            raise APIError(409, "this server was given a fixed engine and cannot rebuild it")
        with self._lock:
            if self.inflight:
                raise APIError(409, f"{len(self.inflight)} request(s) are in flight; wait for them (or abort "
                                    f"them) before changing the engine's settings")
            if self._rebuilding:
                raise APIError(409, "a rebuild is already in progress")
            self._rebuilding = True
        try:
            try:
                config = EngineConfig.from_dict(changes, base=self.engine.config.replace(model=self.model))
                new = self.factory(config)
            except ValueError as exc:
                raise APIError(400, str(exc)) from exc
            except Exception as exc:
                raise APIError(400, f"could not build the engine: {type(exc).__name__}: {exc}") from exc
            with self._lock:
                self.metrics.sync_evictions()
                old, was_running = self.engine, self.engine.running
                self.engine, self.model = new, config.model
                self.generation += 1
                if self.kv_publisher is not None:      # free the ports, then follow the new cache
                    self.kv_publisher.close()
                    self.kv_publisher = self._publish(new)
            if was_running:
                new.start()
            old.stop()
        finally:
            self._rebuilding = False

    def shutdown(self) -> None:
        self.abort_all()
        self.engine.stop()
        if self.kv_publisher is not None:
            self.kv_publisher.close()
