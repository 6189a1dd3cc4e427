"""The dashboard attached to a separately started engine server, in a real browser.

`python -m core.server` on a free 127.0.0.1 port (small pool), then `streamlit run app.py` with
RADIX_ENGINE_URL pointing at it: a request sent with the openai client shows up in the page,
and a prompt sent from the page is served by the server (seen through its own /state routes).
Screenshots land in tests/e2e/artifacts/ (ignored by git)."""
from __future__ import annotations

import os
import pathlib
import time

import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "e2e" / "artifacts"
from tests.e2e import CHROMIUM, CHROMIUM_ARGS
from tests.e2e.processes import attached_stack

ERROR_SELECTORS = ['[data-testid="stException"]', '[data-testid="stAlertContentError"]']

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def stack():
    with attached_stack("attached", ["--pool-slots", "512", "--max-running-requests", "8", "--log-level", "warning"],
                        dict(os.environ)) as urls:
        yield urls


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
