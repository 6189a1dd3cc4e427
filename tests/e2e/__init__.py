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

# Watches the drawn tree on every animation frame, from now on until window.__tree.stop is set: for each
# node id drawn as a ghost (the "evicted (fading)" trace) the wall-clock time it was first drawn; for each
# label word asked for (window.__tree.want) the first time an edge label held it, with the status line at that moment;
# and (log) the wall-clock time each snapshot seq was first drawn. A frame looks the tree up again only
# once the one it holds left the page (a changed figure is a new div) and reads its traces only when
# they changed or a word is still wanted: looking up and measuring every div on every frame forced a
# layout each frame and cost the page it measures ~4 % of a core. A ghost lasts a few tree-changing
# steps, which a fast engine runs within one paint: a check that looks now and then (a locator's
# polling) can miss it.
WATCH_TREE_JS = VISIBLE_TREE_JS + """
  const w = window.__tree = {ghosts: {}, found: {}, want: [], seqs: new Set(), disagree: [], log: [], stop: false};
  const status = () => [...document.querySelectorAll('.sglang')].map(e => e.innerText).join(' ');
  let held = null, read = null;
  const tick = () => { if (w.stop) return;
    if (!held || !held.isConnected) held = tree() || null;
    const d = held && held.data ? held : null;
    if (d && (d.data !== read || w.want.some(word => !(word in w.found)))) { read = d.data; const now = Date.now();
      if (d.layout && d.layout.meta && !w.seqs.has(d.layout.meta.seq)) { w.seqs.add(d.layout.meta.seq); w.log.push([now / 1000, d.layout.meta.seq]); }
      for (const t of d.data) {
        if (t.name === 'evicted (fading)') for (const id of (t.customdata || [])) if (!(id in w.ghosts)) w.ghosts[id] = now;
        if (t.name === 'edge text') for (const word of w.want) if (!(word in w.found)
            && (t.text || []).some(s => String(s).includes(word))) w.found[word] = {at: now, status: status()}; }
      // the caption's "evicted this step: node N ..." must name ghosts of this very drawing
      const ghostIds = new Set(d.data.filter(t => t.name === 'evicted (fading)').flatMap(t => t.customdata || []));
      for (const a of (d.layout.annotations || [])) for (const m of String(a.text || '').matchAll(/node (\\d+) '/g))
        if (String(a.text).includes('evicted this step') && !ghostIds.has(m[1])) w.disagree.push([m[1], d.layout.meta.seq]); }
    requestAnimationFrame(tick); };
  requestAnimationFrame(tick); }"""
