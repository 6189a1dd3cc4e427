"""The dashboard in a real browser: `streamlit run app.py` on a free 127.0.0.1 port, driven by
Playwright over Debian's chromium. Screenshots land in tests/e2e/artifacts/ (ignored by git)."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "e2e" / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ERROR_SELECTORS = ['[data-testid="stException"]', '[data-testid="stAlertContentError"]']

pytestmark = pytest.mark.timeout(600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    if not os.path.exists(CHROMIUM):
        raise RuntimeError("Debian's chromium is missing: .ci/run installs it (apt-get install chromium)")
    port = _free_port()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError(f"streamlit did not start; see {ARTIFACTS / 'streamlit.log'}")
    yield url
    proc.terminate()
    proc.wait(20)
    log.close()


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                          "--disable-component-update", "--disable-sync", "--no-first-run"])
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        pg.goto(server, timeout=120_000)
        yield pg
        browser.close()


def _no_errors(pg) -> None:
    for sel in ERROR_SELECTORS:
        assert pg.locator(sel).count() == 0, pg.locator(sel).first.inner_text()


def _metric(pg, label: str) -> str:
    tile = pg.locator('[data-testid="stMetric"]', has_text=label).first
    return tile.locator('[data-testid="stMetricValue"]').inner_text()


def _wait_text(pg, pattern: str, timeout: float = 120) -> None:
    pg.wait_for_function("p => new RegExp(p).test(document.body.innerText)", arg=pattern, timeout=timeout * 1000)


def test_live_page_prompt_updates_tree_and_kpis(page):
    pg = page
    _wait_text(pg, "RadixAttention, live")
    pg.get_by_text("Prefill computed").first.wait_for(timeout=120_000)
    before = _metric(pg, "Prefill computed")
    pg.get_by_label("Raw completion").check(force=True)
    pg.get_by_label("Prompt", exact=True).fill("Why my code throws errors")
    pg.get_by_role("button", name="Send").click()
    # the tree shows the new node: its edge label carries the prompt text
    _wait_text(pg, "Why my code throws")
    pg.wait_for_function(
        "b => { const t=[...document.querySelectorAll('[data-testid=stMetric]')].find(e=>e.innerText.includes('Prefill computed'));"
        " return t && !t.innerText.includes(b); }", arg=before, timeout=120_000)
    assert _metric(pg, "Prefill computed") != before
    pg.wait_for_timeout(1500)
    pg.screenshot(path=str(ARTIFACTS / "live.png"), full_page=True)
    _no_errors(pg)


def test_live_refresh_holds_one_hertz_while_requests_run(page):
    """The page's own refresh counter, read while three long requests decode: at least 1 Hz."""
    pg = page
    pg.get_by_role("spinbutton", name="Max new tokens").fill("200")
    pg.get_by_role("spinbutton", name="Copies in flight").fill("3")
    pg.get_by_label("Prompt", exact=True).fill("Count slowly from one to one hundred:")
    pg.get_by_role("button", name="Send").click()
    running = r"Running / waiting\s*\n?\s*[1-9]"
    pg.wait_for_function("p => new RegExp(p).test(document.body.innerText)", arg=running, timeout=120_000)
    samples, polls, busy = [], 0, 0
    start = time.time()
    while time.time() - start < 6:
        body = pg.inner_text("body")
        m = re.search(r"· refresh (\d+)", body)
        if m:
            samples.append((time.time(), int(m.group(1))))
        polls += 1
        busy += bool(re.search(running, body))
        pg.wait_for_timeout(200)
    (t0, r0), (t1, r1) = samples[0], samples[-1]
    rate = (r1 - r0) / (t1 - t0)
    print(f"live refresh: {rate:.2f} Hz while requests ran ({busy} of {polls} polls saw them running)")
    assert busy == polls, f"requests finished during the check ({busy} of {polls} polls saw them running)"
    assert rate >= 1.0, f"live refresh at {rate:.2f} Hz: {samples}"
    _no_errors(pg)
    pg.get_by_role("spinbutton", name="Copies in flight").fill("1")
    pg.get_by_role("spinbutton", name="Max new tokens").fill("24")


def test_bad_input_shows_a_message_and_the_engine_keeps_running(page):
    pg = page
    pg.get_by_label("Prompt", exact=True).fill("   ")
    pg.get_by_role("button", name="Send").click()
    _wait_text(pg, "Empty prompt: type some text")
    pg.get_by_label("Prompt", exact=True).fill("Why my code is slow")
    pg.get_by_role("button", name="Send").click()
    _wait_text(pg, "Why my code is slow|is slow")
    pg.screenshot(path=str(ARTIFACTS / "live_error.png"), full_page=True)


def test_walkthrough_reaches_time_3_and_evicts_slots_6_to_9(page, server):
    pg = page
    pg.goto(server + "/walkthrough", timeout=120_000)
    _wait_text(pg, "Walkthrough: the article")
    for t in range(4):
        pg.get_by_role("button", name="Next ▶").click()
        _wait_text(pg, f"Time {t}:")
    _wait_text(pg, "Evict\\.")
    body = pg.inner_text("body")
    assert "[6,7,8,9]" in body and "won't compile" in body
    assert "alloc(3) takes slots [6,7,8]" in body
    pg.wait_for_timeout(1000)
    pg.screenshot(path=str(ARTIFACTS / "walkthrough_time3.png"), full_page=True)
    _no_errors(pg)
