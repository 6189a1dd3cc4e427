"""`make run` (core/server/launch.py): Ctrl-C from a terminal reaches the whole foreground process
group, `kill` or a service manager sends SIGTERM to the launcher, a closed terminal sends SIGHUP to the
group, and SIGKILL can't be caught: each time both the engine server and the dashboard must stop
(quietly where the launcher lives to stop them) and free their ports."""
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

from core.server import http_probe

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_launcher(sigint_ignored: bool = False) -> tuple[subprocess.Popen, int, int]:
    ui, srv = _free_port(), _free_port()
    env = dict(os.environ, PORT=str(ui), SERVER_PORT=str(srv), RADIX_POOL_SLOTS="64")
    env.pop("RADIX_ENGINE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "core.server.launch"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,   # a terminal's group
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored
                            else None)
    deadline = time.time() + 240
    while time.time() < deadline and not (http_probe.listening(ui) and http_probe.listening(srv)):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{srv}/health", timeout=5) as r:
        assert r.status == 200
    return proc, ui, srv


def _stop(proc: subprocess.Popen, send) -> str:
    """Send the stop signal (`send()`), wait for the launcher to exit and return its output; a launcher
    still running after 60 s is killed with its group, so the test leaves nothing behind."""
    try:
        send()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


def test_kill_int_stops_both_even_when_the_launcher_inherited_sigint_ignored():
    """A script that starts `make run` in the background hands it SIGINT ignored; Python then raises no
    KeyboardInterrupt, and the launcher used to sit through kill -INT with both children running."""
    proc, ui, srv = _start_launcher(sigint_ignored=True)
    out = _stop(proc, lambda: proc.send_signal(signal.SIGINT))
    assert proc.returncode == 0, out
    assert not http_probe.listening(ui) and not http_probe.listening(srv)


@pytest.mark.parametrize("signum,to_group", [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, True)],
                         ids=["ctrl-c to the terminal group", "sigterm to the launcher", "sighup to the group"])
def test_a_stop_signal_stops_both_quietly(signum: int, to_group: bool):
    proc, ui, srv = _start_launcher()
    out = _stop(proc, lambda: os.killpg(proc.pid, signum) if to_group else proc.send_signal(signum))
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    assert not http_probe.listening(ui) and not http_probe.listening(srv)


def test_a_killed_launcher_takes_both_children_with_it():
    """SIGKILL can't be handled: the children, in their own sessions, stop on the parent-death signal."""
    proc, ui, srv = _start_launcher()
    try:
        proc.kill()
        proc.communicate(timeout=30)
        deadline = time.time() + 30
        while time.time() < deadline and (http_probe.listening(ui) or http_probe.listening(srv)):
            time.sleep(0.5)
        assert not http_probe.listening(ui) and not http_probe.listening(srv)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
