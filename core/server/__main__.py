"""`python -m core.server`: serve the engine over HTTP (OpenAI-compatible, /metrics, /state).

    python -m core.server --port 30000 --model default
    curl http://127.0.0.1:30000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "default", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'
"""
from __future__ import annotations

import argparse
import sys
import threading

from core import env
from core.engine.config import EngineConfig, add_flags, from_args
from core.server.app import DEFAULT_MAX_BODY_BYTES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m core.server", description="Serve the RadixAttention engine: "
                                 "OpenAI-compatible /v1 routes, Prometheus /metrics, the dashboard's /state routes.")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for a GPU box "
                                                        "the dashboard reaches over the network: set --api-key)")
    ap.add_argument("--port", type=int, default=30000, help="port (default 30000, as SGLang)")
    add_flags(ap, EngineConfig(model=env.model()))   # --model, --pool-slots, ... (core/engine/config.py)
    ap.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    ap.add_argument("--api-key", default=env.api_key(),
                    help="require 'Authorization: Bearer KEY' on every route but /health (env RADIX_API_KEY)")
    ap.add_argument("--max-queue-requests", type=int, default=256,
                    help="requests in flight (waiting + running) before new ones get 503 (default 256)")
    ap.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                    help=f"largest request body; larger ones get 413 (default {DEFAULT_MAX_BODY_BYTES:,})")
    ap.add_argument("--kv-events-config", default=None, metavar="JSON",
                    help="publish KV cache events as SGLang does, e.g. '{\"publisher\": \"zmq\", "
                         "\"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\"}'")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = ap.parse_args(argv)
    if args.kv_events_config is not None:
        from core.kv_events.publish_config import parse_config
        try:
            parse_config(args.kv_events_config)     # before the model loads: a typo costs no wait
        except ValueError as exc:
            ap.error(str(exc))
    for name in ("max_queue_requests", "max_body_bytes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        args.engine_config = from_args(args)
    except ValueError as exc:
        ap.error(str(exc))
    return args


class RunnerCache:
    """Loaded models by name, so a rebuild that changes only the pool or a policy reloads nothing."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._runners: dict = {}
        self._lock = threading.Lock()

    def __call__(self, config: EngineConfig):
        from core.engine.engine import Engine
        from core.engine.model.runner import ModelRunner

        key = (config.model, config.model_impl, config.dtype)
        with self._lock:
            if key not in self._runners:
                self._runners[key] = ModelRunner(config.model, device=self.device, impl=config.model_impl,
                                                 numerics=config.dtype)
            runner = self._runners[key]
        return Engine(runner, config)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import uvicorn

    from core.server.app import ServerSettings, create_app

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    config = args.engine_config
    settings = ServerSettings(api_key=args.api_key, served_model_name=args.served_model_name, model=args.model,
                              max_body_bytes=args.max_body_bytes, max_queue_requests=args.max_queue_requests,
                              kv_events_config=args.kv_events_config)
    try:
        app = create_app(factory=RunnerCache(args.device), settings=settings, initial_config=config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print("warning: listening beyond this machine without --api-key: anyone who reaches the port can use "
              "and rebuild the engine", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
