"""The processes the browser tests start: free ports, waiting for an answer, stopping, and `make run`'s pair
(the engine server and the dashboard attached to it), shared by every browser test file."""
from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence

from tests.e2e import CHROMIUM

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "e2e" / "artifacts"


def require_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        raise RuntimeError("Debian's chromium is missing: .ci/run installs it (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: pathlib.Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[2]} exited; see {log}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def attached_stack(name: str, server_args: Sequence[str], ui_env: dict) -> Iterator[tuple[str, str]]:
    """`python -m core.server` with `server_args` and `streamlit run app.py` attached to it (RADIX_ENGINE_URL) on
    free 127.0.0.1 ports; yields (server url, dashboard url); logs in artifacts/<name>_server.log / _streamlit.log."""
    require_chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    sport, uport = free_port(), free_port()
    slog, ulog = ARTIFACTS / f"{name}_server.log", ARTIFACTS / f"{name}_streamlit.log"
    with open(slog, "w") as so, open(ulog, "w") as uo:
        server = subprocess.Popen([sys.executable, "-m", "core.server", "--port", str(sport), *server_args],
                                  cwd=ROOT, stdout=so, stderr=subprocess.STDOUT)
        try:
            surl = f"http://127.0.0.1:{sport}"
            wait_http(f"{surl}/health", server, slog)
            ui = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(uport),
                                   "--server.address", "127.0.0.1", "--server.headless", "true"],
                                  cwd=ROOT, env=dict(ui_env, RADIX_ENGINE_URL=surl), stdout=uo,
                                  stderr=subprocess.STDOUT)
            try:
                uurl = f"http://127.0.0.1:{uport}"
                wait_http(uurl, ui, ulog)
                yield surl, uurl
            finally:
                stop(ui)
        finally:
            stop(server)
