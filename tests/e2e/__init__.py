"""Browser tests (real Chromium through Playwright). How both files launch it:"""
import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# No host name but 127.0.0.1 resolves: the page runs offline, as the project must; the tests list
# every request a page makes with a listener (intercepting each one would slow the page itself).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
