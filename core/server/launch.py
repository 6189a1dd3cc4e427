"""`make run`: the engine server (`python -m core.server`) and the dashboard attached to it.

With $RADIX_ENGINE_URL set, only the dashboard starts, attached to that server (a GPU box).
Ctrl-C stops both, and so do SIGTERM (`kill`, a service manager) and SIGHUP (the terminal closed); if either
child dies, the other is stopped too, and on Linux a launcher killed outright (SIGKILL) takes them with it:
nothing is left running on the ports.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

from core import env
from core.engine.config import EngineConfig
from core.engine.model.model_files import needs_conversion
from core.server import http_probe
from core.server.child_process import start_child

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout: app.py lives there


def server_flags() -> list[str]:
    """The dashboard's demo scale (EngineConfig.dashboard): a pool small enough to see every slot;
    RADIX_POOL_SLOTS=160 make run gives a demo that evicts within a few prompts."""
    return EngineConfig.dashboard(env.pool_slots()).to_args(["pool_slots", "max_running_requests",
                                                              "max_prefill_tokens"])


COLD_START_SECONDS = 45   # measured: 28 s converting, 45 s to /health on 2 cores (the README says the same)


def starting_message(url: str, model: str) -> str:
    """What the launcher says while the server starts: the one-time conversion and its cost only when the
    model's converted folder is not cached yet (a warm start takes seconds and says nothing about it)."""
    if needs_conversion(model):
        return (f"engine server starting on {url}: converting the model once, about {COLD_START_SECONDS} s "
                f"(later starts skip this)...")
    return f"engine server starting on {url}..."


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600, path: str = "/health") -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        if http_probe.answers(f"{url}{path}"):
            return True
        time.sleep(0.5)
    return False


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt  # SIGINT / SIGTERM / SIGHUP: stop the children as Ctrl-C does


def _stop(procs: list[subprocess.Popen], dashboard_url: str = "", loading: Optional[subprocess.Popen] = None) -> None:
    """Stop the children: SIGINT (a graceful stop) for those up; SIGTERM for a server still `loading`, which has
    no handler yet and ends quietly (SIGINT printed a KeyboardInterrupt traceback from inside torch's imports)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):   # already stopping: a second signal must not
        signal.signal(sig, signal.SIG_IGN)                        # cut this short and orphan a child
    if dashboard_url and procs[-1].poll() is None:
        # Streamlit stopped while its web server is still starting prints a traceback ("'Server' object has
        # no attribute 'servers'", 1.67): its port can already accept before it serves; let it finish first
        _wait_healthy(dashboard_url, procs[-1], timeout=10, path="/_stcore/health")
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM if p is loading else signal.SIGINT)
    deadline = time.time() + 15
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="make run", description="Start the engine server and the dashboard attached to "
                                 "it (with RADIX_ENGINE_URL set: only the dashboard, attached to that server). "
                                 "Ctrl-C stops both.")
    ap.add_argument("--port", type=http_probe.tcp_port, default=os.environ.get("PORT", "8501"),
                    help="the dashboard's port (make run PORT=...)")
    ap.add_argument("--server-port", type=http_probe.tcp_port, default=os.environ.get("SERVER_PORT", "30000"),
                    help="the engine server's port (make run SERVER_PORT=...)")
    return ap.parse_args(argv)


def exit_status(name: str, returncode: int) -> tuple[str, int]:
    """How a child's end is told, and the launcher's exit status for it (128 + the signal, as a shell says)."""
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
        return f"{name} was killed by {sig}", 128 - returncode
    return f"{name} exited with status {returncode}", returncode or 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    ui_port = str(args.port)
    dashboard = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", ui_port]
    # no "Loading weights" bars from the server on the terminal (transformers reads this through huggingface_hub)
    child_env = dict(os.environ, HF_HUB_DISABLE_PROGRESS_BARS="1")
    procs: list[subprocess.Popen] = []
    dashboard_url = ""
    loading: Optional[subprocess.Popen] = None
    try:
        flags = [] if env.engine_urls() else server_flags()
    except ValueError as exc:          # a RADIX_* variable that names no value: one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if http_probe.listening(args.port):
        print(f"port {args.port} is taken (another dashboard?); pick another with PORT={args.port + 1} make run",
              file=sys.stderr)
        return 2
    # SIGINT too: a launcher started in the background by a script inherits SIGINT ignored, and Python then
    # raises no KeyboardInterrupt, so Ctrl-C (or kill -INT) would leave both children running
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        if not env.engine_urls():
            port = args.server_port
            if http_probe.listening(port):
                print(f"port {port} is taken (another engine server?). Attach to it with "
                      f"RADIX_ENGINE_URL=http://127.0.0.1:{port} make run, or pick another with "
                      f"SERVER_PORT={port + 1} make run", file=sys.stderr)
                return 2
            url = f"http://127.0.0.1:{port}"
            server = [sys.executable, "-m", "core.server", "--port", str(port), "--log-level", "warning", *flags]
            loading = start_child(server, cwd=ROOT, env=child_env)    # ends with this launcher
            procs.append(loading)
            print(starting_message(url, env.model()), file=sys.stderr, flush=True)
            if not _wait_healthy(url, procs[0]):
                if procs[0].poll() is None:
                    print("the engine server did not answer /health within 600 s; stopping it", file=sys.stderr)
                    return 1
                told, status = exit_status("the engine server", procs[0].returncode)
                oom = "; SIGKILL while loading is usually the kernel's out-of-memory killer" \
                    if procs[0].returncode == -signal.SIGKILL else ""
                print(f"{told} before it answered /health (see its messages above{oom})", file=sys.stderr)
                return status
            loading = None
            child_env["RADIX_ENGINE_URL"] = url
            print(f"engine server ready: {url}  (try: curl {url}/v1/models)", file=sys.stderr, flush=True)
        else:
            print(f"attaching the dashboard to {','.join(env.engine_urls())}", file=sys.stderr, flush=True)
        procs.append(start_child(dashboard, cwd=ROOT, env=child_env))
        dashboard_url = f"http://127.0.0.1:{ui_port}"
        while all(p.poll() is None for p in procs):
            time.sleep(0.3)
        dead = next(p for p in procs if p.poll() is not None)
        names = ["the engine server", "the dashboard"][-len(procs):]
        told, status = exit_status(names[procs.index(dead)], dead.returncode)
        rest = [n for n, p in zip(names, procs) if p is not dead]
        print(told + (f"; stopping {rest[0]}" if rest else ""), file=sys.stderr)
        return status
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(procs, dashboard_url, loading)


if __name__ == "__main__":
    sys.exit(main())
