"""create_app: the FastAPI app over one EngineHost (routes, auth, body limit, errors, lifespan).

Tests pass an already-built Engine (a tiny random model) or a factory; `python -m core.server`
passes a factory that loads the model named on its command line.
"""
from __future__ import annotations

import asyncio
import secrets
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable, Optional, Union

from fastapi import APIRouter, Depends, FastAPI, Request, Response

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.server import errors, openai_routes, state_routes
from core.server.errors import APIError
from core.server.host import EngineHost

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass
class ServerSettings:
    api_key: Optional[str] = None
    served_model_name: Optional[str] = None
    model: str = "default"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queue_requests: int = 256
    kv_events_config: Optional[str] = None     # SGLang's --kv-events-config JSON: publish KV events on ZMQ


def make_body_reader(limit: int):
    async def read_body(request: Request) -> bytes:
        """The body, or 413 as soon as it passes `limit` (a declared length is checked before reading)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the body is {int(declared):,} bytes, over the server's limit of {limit:,} "
                                f"(--max-body-bytes)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the body is over the server's limit of {limit:,} bytes (--max-body-bytes)")
            chunks.append(chunk)
        return b"".join(chunks)
    return read_body


def make_auth(api_key: Optional[str]):
    expected = f"Bearer {api_key}".encode() if api_key else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        got = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(got, expected):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' with "
                                "the key the server was started with (--api-key)", code="invalid_api_key")
    return check


def create_app(engine: Optional[Engine] = None, factory: Optional[Callable[[EngineConfig], Engine]] = None,
               settings: Optional[ServerSettings] = None,
               initial_config: Union[EngineConfig, dict, None] = None) -> FastAPI:
    """Serve `engine`, or `factory(initial_config)`; `factory` also serves rebuilds from the dashboard.
    The app starts the engine loop on startup and stops it (aborting what is in flight) on shutdown."""
    s = settings or ServerSettings()
    if isinstance(initial_config, dict):
        initial_config = EngineConfig.from_dict({"model": s.model, **initial_config})
    if engine is None:
        if factory is None:
            raise ValueError("create_app needs an engine or a factory")
        engine = factory(initial_config or EngineConfig(model=s.model))
    host = EngineHost(engine, factory, model=initial_config.model if initial_config else s.model,
                      served_model_name=s.served_model_name, max_queue_requests=s.max_queue_requests,
                      kv_events_config=s.kv_events_config)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        host.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(host.shutdown)

    app = FastAPI(title="RadixAttention engine", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.host = host
    errors.install(app)
    read_body = make_body_reader(s.max_body_bytes)
    guarded = APIRouter(dependencies=[Depends(make_auth(s.api_key))])
    guarded.include_router(openai_routes.router(host, read_body))
    guarded.include_router(state_routes.router(host, read_body))

    @guarded.get("/metrics")
    async def metrics():
        body = await asyncio.to_thread(host.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @guarded.api_route("/flush_cache", methods=["POST", "GET"])
    async def flush_cache():
        await asyncio.to_thread(host.flush_cache)
        return {"message": "Cache flushed: the tree is empty and every slot is free."}

    # sglang-router asks for these when it registers a worker (it registers without them too)
    @guarded.get("/get_model_info")
    @guarded.get("/model_info")
    async def model_info():
        return {"model_path": host.model, "tokenizer_path": host.model, "is_generation": True,
                "served_model_name": host.served_model_name}

    @guarded.get("/get_server_info")
    @guarded.get("/server_info")
    async def server_info():
        pub = host.kv_publisher
        kv = None if pub is None else {"endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint,
                                       "block_size": host.engine.cache.page_size}
        return {"model_path": host.model, "served_model_name": host.served_model_name, **host.config(),
                "max_queue_requests": host.max_queue_requests, "version": "radixattention", "kv_events": kv}

    @app.get("/health")
    async def health():
        e = host.engine
        return {"status": "ok", "engine_loop": "running" if e.running else "stepping", "model": host.served_model_name}

    app.include_router(guarded)
    return app
