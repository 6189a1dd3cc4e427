"""`python -m core.server`: serve the engine over HTTP (OpenAI-compatible, /metrics, /state).

    python -m core.server --port 30000 --model default
    curl http://127.0.0.1:30000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "default", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'
"""
from __future__ import annotations

import argparse
import sys

from core import env
from core.engine.config import EngineConfig, add_flags, from_args
from core.server.auth import Keys
from core.server.cpu_pool import DEFAULT_WORKERS
from core.server.drain import DEFAULT_DRAIN_S
from core.server.json_body import DEFAULT_MAX_BODY_BYTES, DEFAULT_READ_TIMEOUT_S


def _list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m core.server", description="Serve the RadixAttention engine: "
                                 "OpenAI-compatible /v1 routes, Prometheus /metrics, the dashboard's /state routes.")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for a GPU box "
                                                        "the dashboard reaches over the network: set the keys)")
    ap.add_argument("--port", type=int, default=30000, help="port (default 30000, as SGLang)")
    add_flags(ap, EngineConfig(model=env.model()))   # --model, --pool-slots, ... (core/engine/config.py)
    ap.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    ap.add_argument("--api-key", action="append", default=None,
                    help="the inference key: 'Authorization: Bearer KEY' on the OpenAI routes, /metrics and the "
                         "dashboard's reads (env RADIX_API_KEY; unset: those routes are open). Give it again for "
                         "more tenants (RADIX_API_KEY=A,B): each key owns its requests and its own cache")
    ap.add_argument("--admin-key", default=env.admin_key(),
                    help="the admin key: flush, rebuild, step mode, everyone's prompts and requests (env "
                         "RADIX_ADMIN_KEY; with --api-key and no admin key those routes are off)")
    ap.add_argument("--allowed-hosts", type=_list, default=[], metavar="NAMES",
                    help="Host names served besides loopback (comma-separated; '*' for any): a browser's Host "
                         "check against DNS rebinding")
    ap.add_argument("--allowed-origins", type=_list, default=[], metavar="ORIGINS",
                    help="web origins (https://name:port) whose pages may POST here besides the server's own")
    ap.add_argument("--model-roots", type=_list, default=None, metavar="DIRS",
                    help="folders a rebuild may load models from (comma-separated; default: the model cache and "
                         "the served model's folder; 'default' is always allowed)")
    ap.add_argument("--max-queue-requests", type=int, default=1024,
                    help="requests in flight (waiting + running) before new ones get 503 (default 1024: SGLang's "
                         "bench_serving sends its 1,000 prompts at once)")
    ap.add_argument("--max-request-share", type=int, default=None,
                    help="queue positions one HTTP request may hold at once (default: an eighth of the queue)")
    ap.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                    help=f"largest request body; larger ones get 413 (default {DEFAULT_MAX_BODY_BYTES:,})")
    ap.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT_S,
                    help=f"seconds a client may take to send its headers, or between bytes of its body, before "
                         f"408 (default {DEFAULT_READ_TIMEOUT_S:g})")
    ap.add_argument("--drain-seconds", type=float, default=DEFAULT_DRAIN_S,
                    help=f"on SIGTERM, how long requests in flight may take to finish before they are ended "
                         f"(default {DEFAULT_DRAIN_S:g})")
    ap.add_argument("--cpu-workers", type=int, default=DEFAULT_WORKERS,
                    help=f"threads for tokenizing and other CPU work off the event loop (default {DEFAULT_WORKERS})")
    ap.add_argument("--stream-response-default-include-usage", action="store_true",
                    help="end every stream with a usage chunk, as if stream_options.include_usage were set (SGLang's "
                         "flag: bench_serving's chat client then takes the prompt length from the server)")
    ap.add_argument("--kv-events-config", default=None, metavar="JSON",
                    help="publish KV cache events as SGLang does, e.g. '{\"publisher\": \"zmq\", "
                         "\"endpoint\": \"tcp://127.0.0.1:5557\", \"replay_endpoint\": \"tcp://127.0.0.1:5558\"}'")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = ap.parse_args(argv)
    if args.api_key is not None and not all(k.strip() for k in args.api_key):
        ap.error("--api-key is empty: give the key (an unset variable as --api-key \"$VAR\" would leave the "
                 "server open), or leave the flag out")
    args.api_key = args.api_key or env.api_keys()      # the flags, else the environment's
    try:
        Keys(args.api_key, args.admin_key)               # the keys' own checks, before the model loads
    except ValueError as exc:
        ap.error(str(exc))
    if args.kv_events_config is not None:
        from core.kv_events.publish_config import parse_config
        try:
            parse_config(args.kv_events_config)     # before the model loads: a typo costs no wait
        except ValueError as exc:
            ap.error(str(exc))
    for name in ("max_queue_requests", "max_body_bytes", "cpu_workers"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("read_timeout", "drain_seconds"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    if args.max_request_share is not None and args.max_request_share < 1:
        ap.error("--max-request-share must be >= 1")
    try:
        args.engine_config = from_args(args)
    except ValueError as exc:
        ap.error(str(exc))
    return args


def warnings_for(args: argparse.Namespace, guard: str) -> list[str]:
    """What a server reachable beyond this machine should say at start."""
    if args.host in ("127.0.0.1", "localhost", "::1"):
        return []
    out = [f"listening on {args.host}: answering {guard}"]
    if not args.api_key and not args.admin_key:
        out.append("warning: listening beyond this machine without --api-key or --admin-key: anyone who reaches "
                   "the port can generate, read every prompt, and rebuild the engine")
    elif not args.api_key:
        out.append("warning: no --api-key: anyone who reaches the port can generate (prompts stay hidden without "
                   "the admin key)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from core.server.app import ServerSettings, create_app
    from core.server.browser_guard import HostPolicy
    from core.server.drain import make_server
    from core.server.model_store import RunnerCache, settle_heap

    from core.engine import omp_threads
    omp_threads.reserve(args.torch_threads or torch.get_num_threads())   # before loading: one OpenMP pool
    settings = ServerSettings(api_key=args.api_key, admin_key=args.admin_key, served_model_name=args.served_model_name,
                              model=args.model, max_body_bytes=args.max_body_bytes,
                              max_queue_requests=args.max_queue_requests, max_request_share=args.max_request_share,
                              kv_events_config=args.kv_events_config, bind=args.host,
                              allowed_hosts=args.allowed_hosts, allowed_origins=args.allowed_origins,
                              model_roots=args.model_roots, cpu_workers=args.cpu_workers,
                              read_timeout=args.read_timeout,
                              stream_usage_by_default=args.stream_response_default_include_usage)
    try:
        app = create_app(factory=RunnerCache(), settings=settings, initial_config=args.engine_config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in warnings_for(args, HostPolicy(args.host, args.allowed_hosts).describe()):
        print(line, file=sys.stderr)
    settle_heap()   # the model loaded: its objects frozen, so no full collection walks them mid-stream
    server = make_server(app, host=args.host, port=args.port, log_level=args.log_level,
                         header_timeout=args.read_timeout, drain_seconds=args.drain_seconds)
    try:
        server.run()
    except KeyboardInterrupt:     # uvicorn re-raises the Ctrl-C it drained for
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
