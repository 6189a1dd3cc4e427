"""`make replicas` on a terminal: one ready line naming the router and the workers, none of the router's INFO logs,
no "Invalid HTTP request received" from its probes, no "Failed to download tokenizer" (the servers tell it their
local tokenizer folder), no loading bars; Ctrl-C (SIGINT to the terminal's foreground group) stops everything
with exit 0 and no traceback. Starts one real replica (the default model) behind the real sglang-router."""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from core.server import http_probe
from tests.test_replicas import free_base

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=1):
            line = proc.stdout.readline()
            if line == "":                     # stdout closed: the launcher exited; say how
                proc.wait(30)
                raise AssertionError(f"exited with {proc.returncode} before its ready line: {proc.stderr.read()}")
            return line
        assert proc.poll() is None, f"exited with {proc.returncode}: {proc.stderr.read()}"
    raise TimeoutError("no ready line")


def test_one_ready_line_then_ctrl_c_exits_0_without_a_traceback():
    base = free_base(4)        # router, one server, the router's metrics
    env = dict(os.environ)
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    proc = subprocess.Popen([sys.executable, "-m", "core.replicas", "--replicas", "1", "--port", str(base), "--",
                             "--pool-slots", "256"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)   # a terminal's group
    try:
        ready = read_line(proc, 240)
        worker = f"http://127.0.0.1:{base + 1}"
        assert ready == (f"1 replica(s) behind sglang-router (cache_aware): http://127.0.0.1:{base}/v1 | workers "
                         f"{worker} | dashboard on every replica: RADIX_ENGINE_URL={worker} make run | "
                         f"Ctrl-C stops all\n")
        with urllib.request.urlopen(f"http://127.0.0.1:{base}/workers", timeout=10) as r:
            assert [w["url"] for w in json.loads(r.read())["workers"]] == [worker]
        time.sleep(3)                                  # the router's health probes run meanwhile
        os.killpg(proc.pid, signal.SIGINT)             # Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0
    assert out == ""                                   # the ready line was the only one
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    for noise in ("INFO", "Invalid HTTP request received", "Failed to download tokenizer", "Loading weights"):
        assert noise not in err, err
    assert err.splitlines()[-1] == "stopping the router and the servers..." and len(err.splitlines()) <= 3, err
    for port in (base, base + 1, base + 2):
        assert not http_probe.listening(port), f"port {port} still open"


def test_make_replicas_passes_log_dir_through_only_when_given():
    def command(*extra: str) -> str:
        # run as a top-level make even under `make test` (a sub-make would print "Leaving directory" lines)
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        got = subprocess.run(["make", "-n", "--no-print-directory", "replicas", *extra], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        return got.stdout.splitlines()[-1]
    assert command("LOG_DIR=/tmp/replica-logs").endswith(
        "-m core.replicas --replicas 2 --policy cache_aware --port 30000 --log-dir /tmp/replica-logs -- ")
    assert "--log-dir" not in command()


def _launch(base: int, replicas: int = 1, **env_vars: str) -> subprocess.Popen:
    """`python -m core.replicas` with small pools, in a terminal's process group of its own."""
    return subprocess.Popen([sys.executable, "-m", "core.replicas", "--replicas", str(replicas), "--port", str(base),
                             "--", "--pool-slots", "256"], cwd=ROOT, env=dict(os.environ, **env_vars),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    """Ctrl-C to its group; killed with it when still there after 60 s, so nothing is left behind."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _complete(base: int, key: str) -> tuple[int, str]:
    """A completion through the router with `key`: its status and text."""
    req = urllib.request.Request(f"http://127.0.0.1:{base}/v1/completions", method="POST",
                                 data=json.dumps({"model": "default", "prompt": "The capital of France is",
                                                  "max_tokens": 2, "temperature": 0}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())["choices"][0]["text"]
    except urllib.error.HTTPError as e:
        return e.code, ""


def test_with_a_key_the_router_reads_each_servers_model_and_the_key_stays_off_every_command_line():
    """RADIX_API_KEY reaches the servers; the router is handed it through its environment (on its command line
    `ps` shows it to every local user), so it reads /server_info (it warned "No tokenizer_path or model_path
    found" for each, and asked the hub) and clients with the key are served."""
    base = free_base(4)
    proc = _launch(base, RADIX_API_KEY="replica-key")
    try:
        assert "1 replica(s) behind sglang-router" in read_line(proc, 240)
        ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
        assert ("sglang::router" in ps or "sglang_router" in ps) and "replica-key" not in ps
        assert _complete(base, "replica-key") == (200, " Paris.")
    finally:
        out, err = _stop(proc)
    assert proc.returncode == 0 and "WARN" not in err and "Traceback" not in err, err


def test_with_two_tenant_keys_each_reaches_the_servers_through_the_router():
    """Given a key, the router takes only that one from clients: with two tenants it gets none and passes each
    client's own key through (it refused the second tenant with 401)."""
    base = free_base(4)
    proc = _launch(base, RADIX_API_KEY="tenant-one,tenant-two")
    try:
        lines = [read_line(proc, 240)]
        while "replica(s) behind sglang-router" not in lines[-1]:   # keyless, the router warns it cannot read
            lines.append(read_line(proc, 240))                      # the servers' model (their /server_info)
        assert len(lines) <= 3, lines
        assert [_complete(base, k)[0] for k in ("tenant-one", "tenant-two", "nobody")] == [200, 200, 401]
    finally:
        _stop(proc)


def test_ctrl_c_while_the_servers_load_is_quiet_and_taken_ports_are_one_line_first():
    """SIGINT to a server still importing torch printed a traceback per server; one still loading gets SIGTERM.
    A taken port was found only after every model had loaded, as the router's traceback."""
    base = free_base(4)
    proc = _launch(base, replicas=2)
    time.sleep(3)                                      # the servers import torch and load
    out, err = _stop(proc)
    assert proc.returncode == 0 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", base + 3))          # the router's metrics port
        blocker.listen()
        got = subprocess.run([sys.executable, "-m", "core.replicas", "--replicas", "2", "--port", str(base)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and got.stderr.startswith(f"error: port(s) {base + 3} taken: the router takes "
                                                         f"--port {base}, the servers the 2 above it, its metrics "
                                                         f"{base + 3}"), got.stderr
    same = subprocess.run([sys.executable, "-m", "core.replicas", "--port", str(base), "--router-metrics-port",
                           str(base + 1)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert same.returncode == 2 and f"--router-metrics-port {base + 1} is the router's or a server's port" in \
        same.stderr, same.stderr
    far = subprocess.run([sys.executable, "-m", "core.replicas", "--router-metrics-port", "70000"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert far.returncode == 2 and "70000 is not a port number (1-65535)" in far.stderr, far.stderr
