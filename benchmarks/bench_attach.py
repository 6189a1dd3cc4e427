"""Attach mode: does an open, refreshing Live page slow the server's decoding?

Target: with the Live page open in a browser and refreshing, the server decodes at >= 90 % of
its tok/s with no page open. Starts `python -m core.server` (the `make run` settings), then
the dashboard attached to it (`streamlit run app.py` with RADIX_ENGINE_URL), and measures one
streamed request's decode rate (tokens after the first / time after the first) through the
openai client, alternating rounds with no page and with the Live page open in headless
Chromium (Playwright), so both sides see the same machine load.

    .venv/bin/python benchmarks/bench_attach.py [--rounds 3 --tokens 96]
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TARGET = 0.90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up")


def decode_rate(client: openai.OpenAI, tokens: int) -> float:
    """tok/s of one streamed greedy request after its first token (prefill excluded)."""
    stamps = []
    for ch in client.completions.create(model="default", prompt="Count slowly from one to one hundred:",
                                        max_tokens=tokens, temperature=0, stream=True,
                                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        if ch.choices and ch.choices[0].text:
            stamps.append(time.perf_counter())
        if ch.usage is not None:
            n = ch.usage.completion_tokens
    return (n - 1) / (stamps[-1] - stamps[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--settle", type=float, default=4.0, help="seconds the page refreshes before a measurement")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    sport, uport = free_port(), free_port()
    surl, uurl = f"http://127.0.0.1:{sport}", f"http://127.0.0.1:{uport}"
    procs = []
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "core.server", "--port", str(sport), "--log-level",
                                       "warning", "--pool-slots", "1024", "--max-running-requests", "16",
                                       "--max-prefill-tokens", "1024"], cwd=ROOT))
        wait_http(f"{surl}/health", procs[0])
        env = dict(os.environ, RADIX_ENGINE_URL=surl)
        procs.append(subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(uport),
                                       "--server.headless", "true"], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(uurl, procs[1])
        client = openai.OpenAI(base_url=f"{surl}/v1", api_key="none", max_retries=0, timeout=600)
        decode_rate(client, 8)   # warm-up
        rows = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            for r in range(args.rounds):
                closed = decode_rate(client, args.tokens)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(uurl, timeout=600_000)
                page.wait_for_function("() => document.body.innerText.includes('RadixAttention, live')",
                                       timeout=600_000)
                page.wait_for_timeout(args.settle * 1000)
                opened = decode_rate(client, args.tokens)
                if r == args.rounds - 1:
                    os.makedirs(os.path.join(ROOT, "benchmarks", "out"), exist_ok=True)
                    page.screenshot(path=os.path.join(ROOT, "benchmarks", "out", "attach_live.png"), full_page=True)
                page.close()
                rows.append((closed, opened))
                print(f"round {r + 1}: no page {closed:.1f} tok/s, Live page open {opened:.1f} tok/s, "
                      f"ratio {opened / closed:.2f}", flush=True)
            browser.close()
        ratios = [o / c for c, o in rows]
        med = statistics.median(ratios)
        print(f"\nmedian ratio (page open / no page): {med:.2f}  target >= {TARGET:.2f}: "
              f"{'PASS' if med >= TARGET else 'FAIL'}  (load average {os.getloadavg()[0]:.1f})")
        return 0 if med >= TARGET else 1
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
