"""create_app: the FastAPI app over one EngineHost (routes, roles, browser guard, limits, errors, lifespan).

Tests pass an already-built Engine (a tiny random model) or a factory; `python -m core.server`
passes a factory that loads the model named on its command line. Serve it with
`core.server.drain.make_server` (header deadline, drain on SIGTERM).
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from fastapi import Depends, FastAPI, Response

from core.engine.config import EngineConfig
from core.engine.engine import Engine
from core.engine.model.model_files import tokenizer_folder
from core.server import (
    api_schema,
    errors,
    native_routes,
    openai_routes,
    responses_routes,
    state_routes,
    tokenize_routes,
)
from core.server.auth import Caller, Keys
from core.server.browser_guard import BrowserGuard, HostPolicy
from core.server.cpu_pool import DEFAULT_WORKERS, CpuPool
from core.server.host import EngineHost
from core.server.json_body import DEFAULT_MAX_BODY_BYTES, DEFAULT_READ_TIMEOUT_S, make_body_reader
from core.server.model_store import ModelRoots, default_roots
from core.server.response_store import ResponseStore

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class ServerSettings:
    api_key: Union[str, list[str], None] = None   # the inference key, or several tenants' (auth.py)
    admin_key: Optional[str] = None            # the admin key
    served_model_name: Optional[str] = None
    model: str = "default"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queue_requests: int = 1024
    max_request_share: Optional[int] = None    # queue positions one HTTP request may hold (default: 1/8)
    kv_events_config: Optional[str] = None     # SGLang's --kv-events-config JSON: publish KV events on ZMQ
    bind: str = "127.0.0.1"                    # the address served: which Host names are ours (browser_guard.py)
    allowed_hosts: Sequence[str] = ()
    allowed_origins: Sequence[str] = ()
    model_roots: Optional[Sequence[str]] = None   # where a rebuild may load models (default: model_store.py)
    cpu_workers: int = DEFAULT_WORKERS
    read_timeout: float = DEFAULT_READ_TIMEOUT_S
    stream_usage_by_default: bool = False       # SGLang's --stream-response-default-include-usage


def create_app(engine: Optional[Engine] = None, factory: Optional[Callable[[EngineConfig], Engine]] = None,
               settings: Optional[ServerSettings] = None,
               initial_config: Union[EngineConfig, dict, None] = None) -> FastAPI:
    """Serve `engine`, or `factory(initial_config)`; `factory` also serves rebuilds from the dashboard.
    The app starts the engine loop on startup and stops it (aborting what is in flight) on shutdown."""
    s = settings or ServerSettings()
    keys = Keys(s.api_key, s.admin_key)
    if isinstance(initial_config, dict):
        initial_config = EngineConfig.from_dict({"model": s.model, **initial_config})
    if engine is None:
        if factory is None:
            raise ValueError("create_app needs an engine or a factory")
        engine = factory(initial_config or EngineConfig(model=s.model))
    model = initial_config.model if initial_config else s.model
    roots = ModelRoots(s.model_roots if s.model_roots is not None else default_roots(model), model)
    host = EngineHost(engine, factory, model=model, served_model_name=s.served_model_name,
                      max_queue_requests=s.max_queue_requests, kv_events_config=s.kv_events_config,
                      model_roots=roots, max_request_share=s.max_request_share)
    pool = CpuPool(s.cpu_workers)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        host.engine.start()
        try:
            yield
        finally:
            await pool.run(host.shutdown)
            pool.shutdown()

    app = FastAPI(title="RadixAttention engine", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.host, app.state.pool, app.state.keys = host, pool, keys
    errors.install(app)
    read_body = make_body_reader(s.max_body_bytes, s.read_timeout)
    inference, admin = keys.inference_dependency(), keys.admin_dependency()
    routers = [openai_routes.router(host, pool, read_body, inference, s.stream_usage_by_default),
               responses_routes.router(host, pool, read_body, inference, ResponseStore(keys.open)),
               tokenize_routes.router(host, pool, read_body, inference),
               native_routes.router(host, pool, read_body, inference),
               state_routes.router(host, pool, read_body, inference, admin)]
    for r in routers:
        app.include_router(r)

    @app.get("/metrics", operation_id="metrics", response_class=Response,
             responses={200: {"content": {PROMETHEUS_TEXT: {"schema": {"type": "string"}}},
                              "description": "Prometheus text, SGLang's metric names"}})
    async def metrics(caller: Caller = Depends(inference)):
        return Response(await pool.run(host.metrics.render), media_type=PROMETHEUS_TEXT)

    @app.post("/flush_cache", operation_id="flush_cache", response_model=api_schema.Message)
    async def flush_cache(caller: Caller = Depends(admin)):
        await pool.run(host.flush_cache)
        return {"message": "Cache flushed: the tree is empty and every slot is free."}

    def model_info() -> dict:
        # the folder the model (and its tokenizer) loaded from: sglang-router loads the tokenizer from server_info's
        # model_path when it registers a worker, and would ask the Hugging Face hub for "default" (a warning)
        folder = tokenizer_folder(host.model)
        return {"model_path": folder, "tokenizer_path": folder, "is_generation": True,
                "served_model_name": host.served_model_name}

    # sglang-router asks for these when it registers a worker (it registers without them too)
    @app.get("/get_model_info", operation_id="get_model_info", response_model=api_schema.OpenObject)
    async def get_model_info(caller: Caller = Depends(inference)):
        return model_info()

    @app.get("/model_info", operation_id="model_info", response_model=api_schema.OpenObject)
    async def model_info_route(caller: Caller = Depends(inference)):
        return model_info()

    def server_info() -> dict:
        pub = host.kv_publisher
        kv = None if pub is None else {"endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint,
                                       "block_size": host.engine.cache.page_size}
        folder = tokenizer_folder(host.model)      # see model_info
        return {"model_path": folder, "tokenizer_path": folder, "served_model_name": host.served_model_name,
                **host.config(),
                "max_queue_requests": host.max_queue_requests, "version": "radixattention", "kv_events": kv}

    @app.get("/get_server_info", operation_id="get_server_info", response_model=api_schema.OpenObject)
    async def get_server_info(caller: Caller = Depends(inference)):
        return server_info()

    @app.get("/server_info", operation_id="server_info", response_model=api_schema.OpenObject)
    async def server_info_route(caller: Caller = Depends(inference)):
        return server_info()

    @app.head("/health", include_in_schema=False)   # some load balancers check with HEAD
    @app.get("/health", operation_id="health", response_model=api_schema.Health,
             responses={503: {"model": api_schema.Health, "description": "step mode or draining: not serving"}})
    async def health():
        """200 while the engine serves; 503 in step mode (inference parked until someone steps) or while
        draining for shutdown, so a router stops sending traffic here."""
        return native_routes.health_response(*host.health())

    api_schema.install(app, secured=not keys.open)
    app.add_middleware(BrowserGuard, policy=HostPolicy(s.bind, s.allowed_hosts, s.allowed_origins))
    app.state.every_route = [*app.routes, *(route for r in routers for route in r.routes)]   # a 405's Allow
    return app
