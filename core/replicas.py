"""`python -m core.replicas`: N engine servers behind SGLang's own router, one OpenAI endpoint.

    python -m core.replicas --replicas 2 --policy cache_aware --port 30000 -- --pool-slots 4096

starts `python -m core.server` on ports 30001..3000N (every argument after `--` goes to each
server), waits until each answers /health, then starts `sglang_router.launch_router` on port
30000 with those workers, its Prometheus metrics on port 3000N+1 (same host), and prints one ready
line with the router's and the workers' URLs. The terminal stays quiet: the router logs warnings
only, the servers errors only (unless --log-level follows `--`) and no loading bars; with --log-dir
everything goes to files there instead (server-N.log, router.log with the router's console, and
its own log file smg.YYYY-MM-DD with its INFO logs). The servers tell the router their model's
local folder (/server_info), so it never asks the Hugging Face hub for a tokenizer. Ctrl-C (or
SIGTERM) stops the router first, then the servers, and exits 0 (make itself, interrupted too, exits 130); if
any process dies on its own,
the others are stopped too and the exit code says so.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

from core import env
from core.server import http_probe
from core.server.child_process import start_child

ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


class Supervisor:
    """Child processes started in their own sessions (ending with this process: core/server/child_process.py),
    stopped together in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.ready: set[str] = set()     # answered its readiness probe: stopped gracefully

    def start(self, name: str, argv: list[str], log: Optional[str], env: Optional[dict] = None) -> subprocess.Popen:
        out = open(log, "w") if log else None
        p = start_child(argv, stdout=out, stderr=subprocess.STDOUT if out else None, env=env)
        self.procs.append((name, p))
        return p

    def dead(self) -> Optional[tuple[str, int]]:
        for name, p in self.procs:
            if p.poll() is not None:
                return name, p.returncode
        return None

    def stop(self, timeout: float = 15.0) -> None:
        """The router gets SIGTERM (SIGINT makes its Python launcher print a KeyboardInterrupt traceback), the
        servers that are up SIGINT (uvicorn's graceful stop), and those still loading SIGTERM: they have no
        handler yet and end quietly (SIGINT printed a traceback from inside torch's imports, one per server)."""
        for name, p in reversed(self.procs):
            if p.poll() is None:
                graceful = name != "router" and name in self.ready
                os.killpg(p.pid, signal.SIGINT if graceful else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, p in reversed(self.procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def wait_for(probe, what: str, sup: Supervisor, timeout: float) -> None:
    """Call probe() until it returns True; a child that exits meanwhile ends the wait with its name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        died = sup.dead()
        if died:
            raise RuntimeError(f"{died[0]} exited with status {died[1]} before it was ready")
        if probe():
            return
        time.sleep(0.3)
    raise RuntimeError(f"{what} within {timeout:.0f} s")


def healthy(url: str) -> bool:
    return http_probe.answers(url + "/health")


def registered(router: str, n: int, key: Optional[str] = None) -> bool:
    """The router answers /health before its workers are registered: n of them listed healthy (asked with the
    servers' key, which a router given it demands)."""
    reply = http_probe.get(router + "/workers", headers={"Authorization": f"Bearer {key}"} if key else None)
    if reply is None or reply.status != 200:
        return False
    try:
        return sum(bool(w.get("is_healthy")) for w in json.loads(reply.body).get("workers", [])) >= n
    except (ValueError, AttributeError):     # not the router's JSON yet
        return False


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m core.replicas", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--replicas", type=int, default=2, help="engine servers to start")
    ap.add_argument("--policy", default="cache_aware", choices=ROUTER_POLICIES, help="the router's policy")
    ap.add_argument("--host", default="127.0.0.1", help="address the router and the servers listen on")
    ap.add_argument("--port", type=http_probe.tcp_port, default=30000,
                    help="the router's port; servers take the next N ports")
    ap.add_argument("--cache-threshold", type=float, help="router: match ratio to follow (its default 0.3)")
    ap.add_argument("--balance-abs-threshold", type=int, help="router: load difference that switches to least-loaded")
    ap.add_argument("--balance-rel-threshold", type=float, help="router: load ratio that also must be exceeded")
    ap.add_argument("--router-metrics-port", type=http_probe.tcp_port,
                    help="the router's /metrics port (default: after the servers')")
    ap.add_argument("--log-dir", help="write server-N.log, router.log (the router's console) and the router's own "
                                      "log file smg.YYYY-MM-DD (INFO included) here instead of the terminal "
                                      "(make replicas LOG_DIR=...)")
    ap.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for each process")
    ap.add_argument("server_args", nargs=argparse.REMAINDER, help="after --: arguments for every core.server")
    return ap


def server_argv(args, port: int, extra: Sequence[str]) -> list[str]:
    """A server with every argument after `--`; errors only on the terminal (its access log and uvicorn's
    warnings about the router's probes are noise there) unless --log-level is given or the logs go to files."""
    quiet = [] if args.log_dir or any(a == "--log-level" or a.startswith("--log-level=") for a in extra) \
        else ["--log-level", "error"]
    return [sys.executable, "-m", "core.server", "--host", args.host, "--port", str(port), *quiet, *extra]


# the router's own launcher, given the servers' key from the environment: on its command line the key would be
# readable by every local user (ps); with it the router reads each server's /server_info, which the key guards
ROUTER_WITH_KEY = ("import os, sys; sys.argv += ['--api-key', os.environ.pop('RADIX_ROUTER_WORKER_KEY')]; "
                   "from sglang_router.launch_router import main; main()")


def server_key(extra: Sequence[str]) -> Optional[str]:
    """The inference key the router is given: the servers' one key (--api-key after `--`, else RADIX_API_KEY).
    None with several (tenants): the router's --api-key is also the only key it takes from clients, so it would
    refuse every tenant but one; keyless, it passes each client's own key through (and cannot read /server_info)."""
    keys = [extra[i + 1] for i, a in enumerate(extra) if a == "--api-key" and i + 1 < len(extra)]
    keys += [a.split("=", 1)[1] for a in extra if a.startswith("--api-key=")]
    keys = keys or env.api_keys()
    return keys[0] if len(keys) == 1 else None


def url_host(host: str) -> str:
    """A host as it goes in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def router_metrics_port(args) -> int:
    return args.router_metrics_port or args.port + args.replicas + 1


def router_argv(args, workers: Sequence[str], key: Optional[str] = None) -> list[str]:
    metrics_port = router_metrics_port(args)
    launcher = ["-c", ROUTER_WITH_KEY] if key else ["-m", "sglang_router.launch_router"]
    argv = [sys.executable, *launcher, "--host", args.host, "--port", str(args.port),
            "--policy", args.policy, "--prometheus-host", args.host, "--prometheus-port", str(metrics_port),
            "--log-level", "info" if args.log_dir else "warn", "--worker-urls", *workers]
    if args.log_dir:     # its own log file there (smg.YYYY-MM-DD, plain text); router.log gets its console
        argv += ["--log-dir", args.log_dir]
    for flag in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold"):
        if getattr(args, flag) is not None:
            argv += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    return argv


def ready_line(args, workers: Sequence[str]) -> str:
    router = f"http://{url_host(args.host)}:{args.port}"
    return (f"{args.replicas} replica(s) behind sglang-router ({args.policy}): {router}/v1 "
            f"| workers {' '.join(workers)} | dashboard on every replica: RADIX_ENGINE_URL={','.join(workers)} "
            f"make run | Ctrl-C stops all")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    extra = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
    if args.replicas < 1:
        print(f"error: --replicas must be at least 1, got {args.replicas}", file=sys.stderr)
        return 2
    if not 0 < args.port < 65535 - args.replicas:
        print(f"error: --port {args.port} leaves no room for {args.replicas} server ports above it", file=sys.stderr)
        return 2
    if any(a in ("--port", "--host") or a.startswith(("--port=", "--host=")) for a in extra):
        print("error: give --host/--port before '--': the launcher picks each server's port", file=sys.stderr)
        return 2
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    log = (lambda name: os.path.join(args.log_dir, f"{name}.log")) if args.log_dir else (lambda name: None)
    sup = Supervisor()
    stopping = {"signal": None}

    def on_signal(signum, _frame) -> None:
        stopping["signal"] = signum
        raise KeyboardInterrupt

    metrics_port = router_metrics_port(args)
    ports = [args.port, *(args.port + i + 1 for i in range(args.replicas)), metrics_port]
    if len(set(ports)) < len(ports):
        print(f"error: --router-metrics-port {metrics_port} is the router's or a server's port (--port {args.port} "
              f"and the {args.replicas} above it); pick another", file=sys.stderr)
        return 2
    taken = [p for p in ports if http_probe.listening(p, args.host)]
    if taken:       # before any model loads (the router's own error came after them, as a traceback)
        print(f"error: port(s) {', '.join(map(str, taken))} taken: the router takes --port {args.port}, the servers "
              f"the {args.replicas} above it, its metrics {metrics_port}; pick another --port (make replicas "
              f"SERVER_PORT=...)", file=sys.stderr)
        return 2
    key = server_key(extra)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    workers = [f"http://{url_host(args.host)}:{args.port + i + 1}" for i in range(args.replicas)]
    # on the terminal, no "Loading weights" bars from every server (transformers reads this through huggingface_hub)
    server_env = None if args.log_dir else dict(os.environ, HF_HUB_DISABLE_PROGRESS_BARS="1")
    try:
        for i, url in enumerate(workers):
            sup.start(f"server-{i}", server_argv(args, args.port + i + 1, extra), log(f"server-{i}"), server_env)
        for i, url in enumerate(workers):
            wait_for(lambda: healthy(url), f"{url} did not answer /health", sup, args.ready_timeout)
            sup.ready.add(f"server-{i}")
        router = f"http://{url_host(args.host)}:{args.port}"
        sup.start("router", router_argv(args, workers, key), log("router"),
                  dict(os.environ, RADIX_ROUTER_WORKER_KEY=key) if key else None)
        wait_for(lambda: healthy(router) and registered(router, args.replicas, key),
                 f"the router at {router} did not list {args.replicas} healthy worker(s)", sup, args.ready_timeout)
        print(ready_line(args, workers), flush=True)
        while True:
            died = sup.dead()
            if died:
                print(f"error: {died[0]} exited with status {died[1]}; stopping the others", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping the router and the servers...", file=sys.stderr, flush=True)
        return 0     # asked to stop, and stopped: make prints no "Error 130"
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_IGN)
        sup.stop()
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
