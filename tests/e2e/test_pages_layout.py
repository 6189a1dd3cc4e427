"""The dashboard's other pages in a real browser at 1400x900 (Playwright over Debian's chromium):
"Run preset" shows its whole label with the sidebar open; the Capacity lab's routing result stays
open after "Route and replay", its routings in far-apart colours; the KV events page keeps the typed
address across a reload and says that nothing listens there. Screenshots go to tests/e2e/artifacts/."""
from __future__ import annotations

import os

import pytest

from tests.e2e import CHROMIUM, CHROMIUM_ARGS
from tests.e2e.processes import ARTIFACTS, free_port, require_chromium, streamlit_app

VIEWPORT = {"width": 1400, "height": 900}
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def url():
    require_chromium()
    with streamlit_app("app.py", ARTIFACTS / "streamlit_pages.log", dict(os.environ)) as (address, _):
        yield address


@pytest.fixture(scope="module")
def page(url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        pg = b.new_page(viewport=VIEWPORT)
        yield pg
        b.close()


def test_run_preset_shows_its_whole_label_with_the_sidebar_open(url, page):
    page.goto(url, timeout=120_000)
    page.get_by_role("button", name="Send").wait_for(timeout=300_000)
    page.locator('[data-testid="stExpandSidebarButton"]').click()
    page.get_by_text("Engine").first.wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(ARTIFACTS / "live_sidebar_open.png"))
    label = page.get_by_role("button", name="Run preset").locator("p")
    widths = label.evaluate("e => [e.scrollWidth, e.clientWidth, e.getBoundingClientRect().right, "
                            "e.closest('button').getBoundingClientRect().right]")
    assert widths[0] <= widths[1] and widths[2] <= widths[3], widths     # not cut, inside its button


def test_routing_result_stays_open_in_far_apart_colours(url, page):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    page.goto(f"{url}/capacity", timeout=120_000)
    page.get_by_role("button", name="Run the sweep").click()
    page.get_by_role("button", name="Keep this result").wait_for(timeout=180_000)
    page.get_by_text("Replicas and routing: N caches").first.click()
    go = page.get_by_role("button", name="Route and replay")
    go.wait_for(timeout=60_000)
    routing = page.locator('[data-testid="stExpander"]').filter(has_text="Route and replay")
    csv = routing.get_by_role("button", name="Download CSV")
    for attempt in range(3):   # a click that lands while the expander's own rerun still runs can be dropped
        go.click()             # (Streamlit resets a button's trigger on that rerun): then click again, as a person would
        try:
            csv.wait_for(timeout=60_000)   # visible: the result came and the expander stayed open
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    chart = routing.locator('[data-testid="stPlotlyChart"]')
    chart.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(ARTIFACTS / "lab_routing.png"))
    strokes = chart.locator("g.trace.scatter path.js-line").evaluate_all("ps => ps.map(p => p.style.stroke)")
    assert "rgb(217, 119, 6)" in strokes and "rgb(37, 99, 235)" in strokes, strokes   # round_robin, cache_aware


def test_kv_events_address_survives_a_reload_and_nothing_listening_is_said(page, url):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    page.goto(f"{url}/kv_events", timeout=120_000)
    box = page.get_by_label("Endpoint (the engine's PUB socket)")
    box.fill(endpoint)
    box.press("Enter")
    page.get_by_text(f"Nothing listens at {endpoint}").wait_for(timeout=60_000)
    assert "kv_endpoint=" in page.url
    page.reload()
    page.get_by_text(f"Nothing listens at {endpoint}").wait_for(timeout=60_000)
    from playwright.sync_api import expect
    expect(page.get_by_label("Endpoint (the engine's PUB socket)")).to_have_value(endpoint, timeout=30_000)
    assert page.locator('[data-testid="stAlertContentSuccess"]').count() == 0     # no green "Exact"
    page.screenshot(path=str(ARTIFACTS / "kv_events_reload.png"))
