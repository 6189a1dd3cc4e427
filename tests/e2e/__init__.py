"""Browser tests (real Chromium through Playwright). How the files launch it, and what they wait for:"""
import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# No host name but 127.0.0.1 resolves: the page runs offline, as the project must; the tests list
# every request a page makes with a listener (intercepting each one would slow the page itself).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


def wait_first_screen(pg) -> None:
    """Until a new Live tab has drawn its hidden views (FIRST_SCREEN_S after it opened): as a presenter
    would wait, and so that those 1-2 s of the browser's do not fall on what a test times next."""
    pg.wait_for_function("() => ![...document.querySelectorAll('[data-testid=stCaptionContainer]')]"
                         ".some(e => e.textContent.includes('Drawing this view'))", timeout=60_000)
