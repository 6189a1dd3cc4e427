"""The dashboard attached to a separately started engine server, in a real browser.

`python -m core.server` on a free 127.0.0.1 port (small pool), then `streamlit run app.py` with
RADIX_ENGINE_URL pointing at it: a request sent with the openai client shows up in the page,
and a prompt sent from the page is served by the server (seen through its own /state routes).
Screenshots land in tests/e2e/artifacts/ (ignored by git)."""
from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "e2e" / "artifacts"
from tests.e2e import CHROMIUM, CHROMIUM_ARGS

ERROR_SELECTORS = ['[data-testid="stException"]', '[data-testid="stAlertContentError"]']

pytestmark = pytest.mark.timeout(600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: pathlib.Path, timeout: float = 300) -> None:
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


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def stack():
    if not os.path.exists(CHROMIUM):
        raise RuntimeError("Debian's chromium is missing: .ci/run installs it (apt-get install chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    sport, uport = _free_port(), _free_port()
    slog, ulog = ARTIFACTS / "attached_server.log", ARTIFACTS / "attached_streamlit.log"
    with open(slog, "w") as so, open(ulog, "w") as uo:
        server = subprocess.Popen([sys.executable, "-m", "core.server", "--port", str(sport), "--pool-slots", "512",
                                   "--max-running-requests", "8", "--log-level", "warning"],
                                  cwd=ROOT, stdout=so, stderr=subprocess.STDOUT)
        try:
            surl = f"http://127.0.0.1:{sport}"
            _wait_http(f"{surl}/health", server, slog)
            env = dict(os.environ, RADIX_ENGINE_URL=surl)
            ui = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(uport),
                                   "--server.address", "127.0.0.1", "--server.headless", "true"],
                                  cwd=ROOT, env=env, stdout=uo, stderr=subprocess.STDOUT)
            try:
                uurl = f"http://127.0.0.1:{uport}"
                _wait_http(uurl, ui, ulog)
                yield surl, uurl
            finally:
                _stop(ui)
        finally:
            _stop(server)


@pytest.fixture(scope="module")
def page(stack):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        pg.goto(stack[1], timeout=300_000)
        yield pg
        browser.close()


def _wait_text(pg, pattern: str, timeout: float = 180) -> None:
    pg.wait_for_function("p => new RegExp(p).test(document.body.innerText)", arg=pattern, timeout=timeout * 1000)


def _no_errors(pg) -> None:
    for sel in ERROR_SELECTORS:
        assert pg.locator(sel).count() == 0, pg.locator(sel).first.inner_text()


def test_a_request_from_the_openai_client_appears_in_the_page(stack, page):
    surl, _ = stack
    _wait_text(page, "RadixAttention, live")
    client = openai.OpenAI(base_url=f"{surl}/v1", api_key="none", max_retries=0, timeout=300)
    r = client.completions.create(model="default", prompt="Zebras graze on the savanna at dawn", max_tokens=6,
                                  temperature=0)
    assert r.usage.completion_tokens >= 1
    _wait_text(page, "Zebras graze")      # the tree's edge labels carry the prompt's text
    page.screenshot(path=str(ARTIFACTS / "attached_openai_request.png"), full_page=True)
    _no_errors(page)


def test_a_prompt_sent_from_the_page_is_served_by_the_server(stack, page):
    from radixui.connect.http_client import HttpClient

    surl, _ = stack
    page.get_by_label("Raw completion").check(force=True)
    page.get_by_label("Prompt", exact=True).fill("Why my code is slow")
    page.get_by_role("button", name="Send").click()
    server = HttpClient(surl)
    deadline = time.time() + 180
    while time.time() < deadline:
        done = [v for v in server.snapshot().requests if v.prompt_text == "Why my code is slow" and
                v.state == "finished"]
        if done:
            break
        time.sleep(0.5)
    assert done and done[-1].output_tokens >= 1, [(v.prompt_text, v.state) for v in server.snapshot().requests]
    _wait_text(page, "Why my code is slow|is slow")
    page.screenshot(path=str(ARTIFACTS / "attached_page_prompt.png"), full_page=True)
    _no_errors(page)
