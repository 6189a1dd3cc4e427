"""Issue 26, item 6: SIGTERM drains. New requests get 503 (Retry-After) and /health says draining; what
finishes within the grace period finishes; the rest ends with an OpenAI error (a stream: an error event,
then [DONE]); no traceback."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from core.server.app import ServerSettings
from tests.server.conftest import serving, tiny_factory, wait_until
from tests.server.tiny_checkpoint import make_tiny_checkpoint

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_drain_finishes_what_it_can_and_ends_the_rest_with_openai_errors(tiny_runner):
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny"), drain_seconds=5) as s:
        e = s.engine
        e.stop()                    # step mode: the test decides what finishes within the grace period
        got: dict = {}

        def long_stream():
            with httpx.stream("POST", s.url + "/v1/completions", timeout=30,
                              json={"model": "tiny", "prompt": PROMPT, "max_tokens": 200, "stream": True}) as r:
                got["stream"] = [ln for ln in r.iter_lines() if ln]

        def long_json():
            got["json"] = httpx.post(s.url + "/v1/completions", timeout=30,
                                     json={"model": "tiny", "prompt": PROMPT[:5], "max_tokens": 200})

        def short_json():
            got["short"] = httpx.post(s.url + "/v1/completions", timeout=30,
                                      json={"model": "tiny", "prompt": PROMPT[:3], "max_tokens": 2})

        threads = [threading.Thread(target=f) for f in (long_stream, long_json, short_json)]
        for t in threads:
            t.start()
        wait_until(lambda: len(s.host.inflight) == 3, what="three requests in flight")
        s.server.handle_exit(signal.SIGTERM, None)
        wait_until(lambda: s.host.draining, what="the drain to start")
        r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "server_shutting_down"
        h = httpx.get(s.url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "draining"
        for _ in range(3):          # enough steps for the short one only
            e.step()
        for t in threads:
            t.join(30)
    assert got["short"].status_code == 200 and got["short"].json()["usage"]["completion_tokens"] == 2
    assert got["json"].status_code == 503 and got["json"].headers["retry-after"]
    assert got["json"].json()["error"]["code"] == "server_shutting_down"
    lines = got["stream"]
    assert lines[-1] == "data: [DONE]"
    err = json.loads(lines[-2][6:])["error"]
    assert err["code"] == "server_shutting_down" and err["type"] == "service_unavailable"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(300)
def test_sigterm_to_the_server_process_ends_streams_with_an_error_event_and_done_and_prints_no_traceback(tmp_path):
    model = make_tiny_checkpoint(tmp_path / "tiny")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "core.server", "--model", str(model), "--port", str(port),
                             "--pool-slots", "4096", "--drain-seconds", "1", "--log-level", "warning"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.poll() else "no start"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        got: dict = {}

        def stream():
            with httpx.stream("POST", url + "/v1/completions", timeout=60,
                              json={"model": str(model), "prompt": "Once upon a time", "max_tokens": 4000,
                                    "ignore_eos": True, "stream": True}) as r:
                got["stream"] = [ln for ln in r.iter_lines() if ln]

        def whole():
            got["json"] = httpx.post(url + "/v1/completions", timeout=60,
                                     json={"model": str(model), "prompt": "Hello", "max_tokens": 4000,
                                           "ignore_eos": True})

        threads = [threading.Thread(target=f) for f in (stream, whole)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert got["stream"][-1] == "data: [DONE]" and '"server_shutting_down"' in got["stream"][-2]
    assert got["json"].status_code == 503 and got["json"].json()["error"]["code"] == "server_shutting_down"
    assert "Traceback" not in out and "CancelledError" not in out, out
    assert proc.returncode in (0, -signal.SIGTERM)
