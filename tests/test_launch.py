"""`make run` (radixui/launch.py): Ctrl-C from a terminal reaches the whole foreground process
group; both the engine server and the dashboard must stop, quietly, and free their ports."""
from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_ctrl_c_to_the_terminal_group_stops_both_quietly():
    ui, srv = _free_port(), _free_port()
    env = dict(os.environ, PORT=str(ui), SERVER_PORT=str(srv), RADIX_POOL_SLOTS="64")
    env.pop("RADIX_ENGINE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "radixui.launch"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)   # a terminal's group
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (_listening(ui) and _listening(srv)):
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{srv}/health", timeout=5) as r:
            assert r.status == 200
        os.killpg(proc.pid, signal.SIGINT)        # what Ctrl-C in the terminal sends
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    assert not _listening(ui) and not _listening(srv)
