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


# The visible radix tree's plotly div, as a JS arrow function's opening: `tree()` finds it (the Time
# travel tab's tree is hidden: its height is 0). Callers close the body with their own code and "}".
VISIBLE_TREE_JS = """() => { const tree = () => [...document.querySelectorAll('[data-testid=stPlotlyChart] .js-plotly-plot')]
  .find(d => d.getBoundingClientRect().height > 0 && (d.data || []).some(t => t.name === 'edge text'));"""

# From now on, on every animation frame until window.__ghosts.stop is set: the node ids the visible
# tree has drawn as ghosts (its "evicted (fading)" trace), in window.__ghosts.ids. A ghost lasts a few
# tree-changing steps, which a fast engine runs within one paint, so a check that looks now and then (a
# locator's polling) can miss it. The tree is looked up again only once the div held left the page (a
# changed figure is a new div): a lookup each frame forces a layout.
WATCH_GHOSTS_JS = VISIBLE_TREE_JS + """
  const w = window.__ghosts = {ids: [], stop: false};
  let held = null;
  const tick = () => { if (w.stop) return;
    if (!held || !held.isConnected) held = tree() || null;
    for (const t of (held && held.data) || []) if (t.name === 'evicted (fading)')
      for (const id of t.customdata || []) if (!w.ids.includes(id)) w.ids.push(id);
    requestAnimationFrame(tick); };
  requestAnimationFrame(tick); }"""
