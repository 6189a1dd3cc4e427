"""How `make run` (core/server/launch.py) ends when something goes wrong: a stop while the model loads is
quiet, a child that dies is named with its signal and sets the exit status, and a taken dashboard port or a bad
RADIX_* value or port is one line before anything starts."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from core.server import http_probe
from tests.server.test_launch import ROOT, _free_port, _start_launcher, _stop

pytestmark = pytest.mark.timeout(300)


def _launch(**env_vars) -> subprocess.Popen:
    env = {**os.environ, "PORT": str(_free_port()), "SERVER_PORT": str(_free_port()), "RADIX_POOL_SLOTS": "64",
           **env_vars}
    env.pop("RADIX_ENGINE_URL", None)
    return subprocess.Popen([sys.executable, "-m", "core.server.launch"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _server_pid(port: int) -> int:
    out = subprocess.run(["pgrep", "-f", f"core.server --port {port} "], capture_output=True, text=True).stdout
    return int(out.split()[0])


def test_ctrl_c_while_the_model_loads_stops_the_server_without_a_traceback():
    """The server has no signal handler while it imports torch and loads: SIGINT printed a KeyboardInterrupt
    traceback from inside those imports; the launcher sends a loading server SIGTERM."""
    proc = _launch()
    line = proc.stdout.readline()
    assert "engine server starting on" in line, line
    time.sleep(2)                                       # importing torch, or loading the model
    out = _stop(proc, lambda: os.killpg(proc.pid, signal.SIGINT))
    assert proc.returncode == 0 and "Traceback" not in out, out


def test_a_killed_server_is_named_with_its_signal_and_sets_the_exit_status():
    proc, ui, srv = _start_launcher()
    out = _stop(proc, lambda: os.kill(_server_pid(srv), signal.SIGKILL))
    assert "the engine server was killed by SIGKILL; stopping the dashboard" in out, out
    assert proc.returncode == 128 + signal.SIGKILL
    assert not http_probe.listening(ui) and not http_probe.listening(srv)


def test_a_taken_dashboard_port_is_one_line_before_the_model_loads():
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        proc = _launch(PORT=str(port))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == f"port {port} is taken (another dashboard?); pick another with " \
                                          f"PORT={port + 1} make run\n", out


@pytest.mark.parametrize("env_vars, message", [
    ({"RADIX_POOL_SLOTS": "abc"}, "RADIX_POOL_SLOTS"),
    ({"SERVER_PORT": "99999"}, "99999 is not a port number (1-65535)"),
    ({"PORT": "x"}, "'x' is not a port number (1-65535)"),
])
def test_a_bad_setting_is_one_line_and_exit_2(env_vars, message):
    proc = _launch(**env_vars)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and message in out and "Traceback" not in out, out
    assert len(out.strip().splitlines()) <= 2, out      # argparse's usage line, then the error
