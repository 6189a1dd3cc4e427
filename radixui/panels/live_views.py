"""The Live page's body: prompt bar and request table on the left, the chosen view on the right,
KPIs in one line above; all drawn from one snapshot taken after this run's submissions."""
from __future__ import annotations

import functools
import time
from typing import Optional

import pandas as pd
import streamlit as st

from core.cache.events import ev_get, ev_kind
from core.observe.snapshot import EngineSnapshot
from core.observe.time_travel import replay_note
from radixui.connect.client import EngineClient
from radixui.figures.event_table import EVENT_KINDS, event_table
from radixui.figures.fmt import html_escape
from radixui.figures.heap import eviction_figure, eviction_table, order_note
from radixui.figures.highlights import TREE_KINDS, Highlights, ghosts_from_events, request_highlights, step_highlights
from radixui.figures.hit_chart import hit_rate_figure
from radixui.figures.kpis import kpi_line, sglang_status
from radixui.figures.slots import kv_heatmap, slot_row_figure, written_range
from radixui.figures.tree import tree_figure, tree_overview
from radixui.panels.abort import abort_selected_button
from radixui.panels.live_data import cached_figure, decoder, event_store, follow_engine
from radixui.panels.live_poll import admitted_snapshot, declare_poll
from radixui.panels.prompt_panel import prompt_panel
from radixui.panels.request_rows import TABLE_CONFIG, request_table, selected_rid, table_key
from radixui.panels.server_down import SERVER_ERRORS, show_server_down

VIEWS = ["Radix tree", "Slot pool", "Eviction heap", "Event log", "Time travel"]
TREE_WIDTH = 900      # px the tree gets at 1400 px with the sidebar closed
TREE_MAX_HEIGHT = 580  # so the whole tree stays on a 900 px screen (under the tabs and its controls)
# A new tab draws its hidden views on the first poll tick this long after its first run (6 s at the
# idle pace): once the browser has drawn the first screen (4-5 s on two busy cores; drawing four
# more views sooner delays the first chart).
FIRST_SCREEN_S = 4.0
def last_tree_step(events: list) -> list:
    """The events of the latest step that changed the tree, so its colours stay until the next change
    (decode steps only allocate slots and would otherwise wash the highlights out at once)."""
    changed = [ev_get(e, "time") for e in events if ev_kind(e) in TREE_KINDS]
    return [e for e in events if changed and ev_get(e, "time") == changed[-1]]


def chunked_prefill_note(snap: EngineSnapshot, max_prefill_tokens: int) -> Optional[str]:
    """Why a long prompt is several nodes: prefill runs in chunks of max_prefill_tokens and each
    finished chunk is inserted into the tree before the next one runs (SGLang's chunked prefill)."""
    long = [r for r in snap.requests if r.prompt_tokens > max_prefill_tokens]
    if not long:
        return None
    r = long[-1]
    chunks = -(-r.prompt_tokens // max_prefill_tokens)
    return (f"Request {r.rid}'s prompt has {r.prompt_tokens:,} tokens, more than max prefill "
            f"({max_prefill_tokens:,}): it is prefilled in {chunks} chunks and each chunk is inserted into the "
            f"tree as it finishes, so the prompt shows as {chunks} nodes in a chain (chunked prefill).")


def live_body(client: EngineClient, cfg, live: bool = True, interval: float = 1.0) -> None:
    """The Live page's fragment; a server that goes away (or refuses this dashboard) mid-demo is said in its
    place, and the page comes back once it answers (server_down.py)."""
    try:
        draw_live(client, cfg, live, interval)
    except SERVER_ERRORS as exc:
        show_server_down(client, exc)


def draw_live(client: EngineClient, cfg, live: bool, interval: float) -> None:
    ss = st.session_state
    # Everything this run draws is read before its first element: a placeholder (st.empty) clears what the
    # last run drew there at once, so the KPI and status lines vanished for the 0.04-0.4 s the reads take,
    # at every repaint (the page below them jumped up and back about once a second while a request ran).
    stepping = client.is_stepping()
    sent = ss.pop("_sent", [])                    # the rids this run's Send submitted (before the script)
    # a Send's run draws its row and keeps the figures as they were (a changed chart is re-plotted from
    # scratch, ~0.5 CPU s of the browser's before it paints the row); the poll's next tick draws them.
    # With live refresh off no tick follows: that run waits for the admission and draws them itself.
    keep = bool(sent) and live
    # after this run's submissions: one engine step for all
    snap = admitted_snapshot(client, () if keep else sent, stepping)
    follow_engine(ss, snap)
    store = event_store(ss)
    store.sync(client, snap)
    tt = decoder(ss, client, snap, cfg.model)
    flash = ss.pop("flash", None)
    err = client.last_error()
    status = sglang_status(snap.metrics)
    st.markdown(kpi_line(snap.metrics, snap.step) + f"<div class='sglang' title='{html_escape(status)}'>{status}</div>",
                unsafe_allow_html=True)
    left, right = st.columns([1.2, 2], gap="medium")
    with left:
        form_box = st.container()                 # filled after the table: see prompt_panel.py
        # messages under the form (the tree never moves down); a placeholder that each run fills or empties,
        # so a message leaves with the next run even when that run is a fragment's or was cut short
        flash_box = st.empty()
    if flash and flash[0] == "success":
        st.toast(flash[1], icon=":material/check_circle:")    # no banner pushing the tree down
        flash = None
    if flash or err:
        with flash_box.container():
            if flash:
                getattr(st, flash[0])(flash[1])
            if err:
                st.warning(f"The engine recovered from an error: {err}")
    else:
        flash_box.empty()
    selected = selected_rid(ss)
    with left:
        pending = ss.setdefault("my_requests", {})
        df = request_table(snap, pending, selected)
        ss["_table_rids"] = list(df["request"])
        ss["_table_key"] = table_key(ss["_table_rids"])
        with st.expander(f"Requests ({len(df)}) · click a row to show its path in the tree", expanded=True):
            if df.empty:
                st.caption("No requests yet: type a prompt and press Send, or run a preset.")
            else:
                st.dataframe(df, hide_index=True, width="stretch", height=min(35 * (len(df) + 1) + 3, 35 * 5 + 3),
                             on_select="rerun", selection_mode="single-row", key=ss["_table_key"],
                             column_config=TABLE_CONFIG)
            abort_selected_button(client, snap, selected)
            if stepping:
                st.caption("Step mode: TTFT counts from submit, so it includes the wait for your Step clicks.")
    with form_box:
        prompt_panel(client)                      # its buttons submitted before this run began
    with left:
        st.plotly_chart(cached_figure(ss, "hits", (snap.step, snap.seq, len(snap.requests)),
                                      lambda: hit_rate_figure(snap.requests, height=130), fresh=not keep),
                        width="stretch", key="hit_chart", config={"displayModeBar": False})
    with right:
        st.fragment(views)(client, snap, tt, store, cfg, selected, keep)   # a tab switch reruns only this
    if keep:
        ss["_catch_up"] = True                   # the poll's next tick draws the figures
    # busy (the poll at the chosen pace, never the idle one) while the engine works or a request this
    # tab sent is not listed yet
    ss["_busy"] = busy = bool(sent) or bool(pending) or not engine_quiet(snap)
    declare_poll(client, live, interval, busy)   # its pace follows the engine, with no extra run


def _tree_highlights(client: EngineClient, snap: EngineSnapshot, store, selected: Optional[str]):
    if selected and snap.redacted:   # the tree's tokens are hidden from this key: no path can be walked in it
        return step_highlights(last_tree_step(store.recent_upto(snap.seq))), (
            f"The path of request **{selected}** cannot be drawn: the tree's tokens are hidden from the "
            f"inference key (RADIX_API_KEY). Start the dashboard with RADIX_ADMIN_KEY to see paths and text.")
    if selected:
        req = next((r for r in snap.requests if r.rid == selected), None)
        toks = client.request_tokens(selected) if req is not None else None   # None: gone from the table
        if toks:
            ids = toks["prompt_ids"] + toks["output_ids"]
            h = request_highlights(snap.cache, ids, req.cached_tokens)
            return h, (f"Path of request **{selected}**: blue = the {req.cached_tokens} prompt tokens it matched in "
                       f"the cache, green = what it inserted. Click its row again to go back to the latest step.")
    return step_highlights(last_tree_step(store.recent_upto(snap.seq))), None


def engine_quiet(snap: EngineSnapshot) -> bool:
    """Nothing running or queued: the moment the hidden views catch up, so that a later switch
    shows current figures at once (mid-generation, or between Step clicks, a switch shows the
    view as it was and its one rerun then redraws it)."""
    m = snap.metrics or {}
    return not m.get("running") and not m.get("waiting")


def views(client: EngineClient, snap: EngineSnapshot, tt, store, cfg, selected: Optional[str],
          keep: bool = False) -> None:
    """The views as tabs: a switch is drawn by the browser alone (every tab's figures are already
    there), then one fragment rerun refreshes the opened tab if its data changed. The open tab is
    rebuilt whenever its data changes; hidden tabs re-send their last figures (the browser does not
    redraw an unchanged figure) and catch up only while the engine is quiet, so refresh work during
    generation stays that of one view. A view never drawn yet waits while it is hidden in a new
    browser tab's first run (so the first chart does not wait for five views' charts) and in a
    tab switch's run (so the opened view is drawn first); the poll asks for the run that draws it
    on its next tick after a switch, and FIRST_SCREEN_S after a new tab's first run. With `keep`
    (a Send's run) every view re-sends its last figures."""
    tabs = st.tabs(VIEWS, key="live_view", on_change=_switched)
    quiet = engine_quiet(snap)
    draw = {"Radix tree": lambda fresh: tree_view(client, snap, tt, store, cfg, selected, fresh),
            "Slot pool": lambda fresh: slot_view(snap, tt, fresh),
            "Eviction heap": lambda fresh: heap_view(snap, tt, fresh),
            "Event log": lambda fresh: log_view(store, tt, fresh),
            "Time travel": lambda fresh: time_travel(snap, tt, store, fresh)}
    ss = st.session_state
    drawn = ss.setdefault("_views_drawn", set())
    defer = "_views_seen" not in ss or ss.pop("_tab_switched", False)
    deferred = False
    for name, tab in zip(VIEWS, tabs):
        with tab:
            hidden = tab.open is False
            if hidden and name not in drawn and defer:
                st.caption("Drawing this view...")
                deferred = True
                continue
            draw[name]((not hidden or quiet) and not keep)
            drawn.add(name)
    if not deferred:
        ss.pop("_catch_up_at", None)
    elif "_views_seen" in ss:
        ss["_catch_up"] = True        # after a switch: on the poll's next tick
    else:                             # a new tab: once its first screen is drawn, so that a first
        ss["_catch_up_at"] = time.monotonic() + FIRST_SCREEN_S   # Send draws its row, not four views
    ss["_views_seen"] = True


def _switched() -> None:
    st.session_state["_tab_switched"] = True


def _chart(fig, key: str) -> None:
    st.plotly_chart(fig, width="stretch", key=key, config={"displayModeBar": False})


def tree_view(client: EngineClient, snap: EngineSnapshot, tt, store, cfg, selected: Optional[str],
              fresh: bool) -> None:
    ss = st.session_state
    c1, c2 = st.columns([1.6, 1], vertical_alignment="center")
    shape = c1.radio("Draw", ["Tree", "Overview"], key="tree_view", horizontal=True,
                     label_visibility="collapsed", help="Overview: boxes sized by the tokens under each node")
    ids = [n.id for n in snap.cache.nodes]
    root = snap.cache.root_id
    if ss.get("tree_focus") not in ids:
        ss["tree_focus"] = root                # never None: the box always names its choice
    focus = c2.selectbox("Focus on subtree", ids, key="tree_focus", label_visibility="collapsed",
                         format_func=lambda i: "whole tree" if i == root else f"subtree of node {i}")
    hl, note = _tree_highlights(client, snap, store, selected)
    ghosts = _ghosts(snap, store, fresh and shape == "Tree") if not selected else ()
    if shape == "Tree":
        def build():
            f = tree_figure(snap.cache, tt, hl, focus=None if focus == root else focus, width=TREE_WIDTH,
                            ghosts=ghosts)
            if f.layout.height > TREE_MAX_HEIGHT:
                f = tree_figure(snap.cache, tt, hl, focus=None if focus == root else focus, width=TREE_WIDTH,
                                ghosts=ghosts, height=TREE_MAX_HEIGHT)
            return f
        fig = cached_figure(ss, "tree", (snap.seq, focus, hl, ghosts), build, fresh)
    else:
        fig = cached_figure(ss, "overview", (snap.seq, hl), lambda: tree_overview(snap.cache, tt, hl), fresh)
    if note:
        st.caption(note)                          # above the tree: on screen with the path it explains
    _chart(fig, "tree_chart")
    chunk = chunked_prefill_note(snap, cfg.max_prefill_tokens)
    if chunk:
        st.caption(chunk)


def _ghosts(snap: EngineSnapshot, store, painting: bool) -> tuple:
    """The ghosts to draw on this snapshot's tree: the last GHOST_STEPS tree-changing steps' evictions
    and every eviction since the snapshot the tree showed before (several steps can run between two
    paints), from the events up to this snapshot's seq only."""
    ss = st.session_state
    drawn = ss.get("_tree_painted")               # (seq drawn, the seq its ghosts counted from)
    base = None if drawn is None else (drawn[1] if drawn[0] == snap.seq else drawn[0])
    if painting:
        ss["_tree_painted"] = (snap.seq, base)
    return ghosts_from_events(store.recent_upto(snap.seq), painted_seq=base)


def slot_view(snap: EngineSnapshot, tt, fresh: bool) -> None:
    ss = st.session_state
    size = snap.pool.num_slots + snap.pool.page_size
    zoom = st.toggle("Written slots only", True, key="slot_zoom",
                     help="Zoom to the slots that have ever held KV (most of a fresh pool never has)")
    if zoom:
        lo, hi = written_range(snap.pool)
    else:
        lo, hi = st.slider("Slot range", 0, size, (0, size), key="slot_range")
        if hi <= lo:                            # both handles on one value: the slot there alone
            lo = min(lo, size - 1)
            hi = lo + 1
    _chart(cached_figure(ss, "row", (snap.step, snap.seq, lo, hi),
                         lambda: slot_row_figure(snap.pool, snap.cache, tt, lo=lo, hi=hi, width=TREE_WIDTH), fresh),
           "slot_row")
    _chart(cached_figure(ss, "heat", (snap.step, snap.seq, lo, hi), lambda: kv_heatmap(snap.pool, lo, hi), fresh),
           "heatmap")


def heap_view(snap: EngineSnapshot, tt, fresh: bool) -> None:
    ss = st.session_state
    st.caption(order_note(snap.cache.policy))
    _chart(cached_figure(ss, "heap", (snap.seq,), lambda: eviction_figure(snap.cache, tt), fresh), "heap_chart")
    st.dataframe(cached_figure(ss, "heap_table", (snap.seq,), lambda: eviction_table(snap.cache, tt, limit=200),
                               fresh), hide_index=True, width="stretch", key="heap_table")


LOG_MARKS = {"split": "✂ split", "evict": "✕ evict"}


def log_table(events: list, tt, kinds: list) -> pd.DataFrame:
    """The newest 300 events as a plain frame, splits and evictions marked in their own column: a
    styled frame (tinted rows) costs ~60 ms to send, and this one is re-sent on every run."""
    df = event_table(events, tt, kinds=kinds, limit=300)
    df["highlight"] = df["highlight"].map(lambda h: LOG_MARKS.get(h, h))
    return df


def log_view(store, tt, fresh: bool) -> None:
    kinds = st.multiselect("Event types", list(EVENT_KINDS), default=list(EVENT_KINDS), key="log_kinds")
    df = cached_figure(st.session_state, "log", (store.last_seq, store.start_seq, tuple(kinds)),
                       lambda: log_table(store.recent(2000), tt, kinds), fresh)
    st.dataframe(df, hide_index=True, width="stretch", height=420, key="log_table")


def _held_end(first: int, last: int) -> int:
    """The time-travel slider's end: held while the chosen event lies before it, the newest event while the
    slider sits at its end. A slider's identity includes its range, so a new end made a new widget that went
    back to the newest event: on a busy engine (a rerun every 0.25 s) no past event could be held."""
    ss = st.session_state
    hi, cur = ss.get("_tt_end"), ss.get("tt_seq")
    if hi is None or cur is None or not first <= cur < hi or hi > last:
        hi = last
    ss["_tt_end"] = hi
    return hi


def time_travel(snap: EngineSnapshot, tt, store, fresh: bool = True) -> None:
    events = store.events
    ss = st.session_state
    # A Send's run re-sends every chart as it was (see views): a view whose last drawing had no chart (no events
    # yet, as after a rebuild) keeps showing none, or the run would plot two charts (a figure cached before the
    # rebuild, even) before the browser paints the Send's row; the poll's next tick draws them.
    if not events or (not fresh and not ss.get("_tt_charted")):
        ss["_tt_charted"] = False
        st.info("No events yet: send a prompt, then slide through its history here.")
        return
    ss["_tt_charted"] = True
    first, last = int(ev_get(events[0], "seq")), int(ev_get(events[-1], "seq"))
    if store.rebased:
        st.caption(f"History from event {store.start_seq:,} on: the engine had dropped older events by the time "
                   f"this tab saw them (its ring keeps the newest), so the past starts from the cache as it was then.")
    hi = _held_end(first, last)
    seq = st.slider("After event", first, hi, hi, key="tt_seq") if hi > first else hi
    if hi < last:
        st.caption(f"{last - hi:,} newer event(s) since you picked this one; drag to the end to follow the newest")
    ev = events[seq - first]
    st.markdown(f"**Event {seq}** at time {ev_get(ev, 'time'):g}: {ev_kind(ev)}")
    note = replay_note(snap.cache.policy)
    if note:
        st.caption(note)
    key = ("tt", seq, first)
    rp = store.replayer_for(snap)
    past = functools.lru_cache(maxsize=1)(lambda: rp.at(seq))   # replayed only if a figure is rebuilt
    _chart(cached_figure(ss, "tt_tree", key,
                         lambda: tree_figure(past(), tt, step_highlights([ev]), width=TREE_WIDTH), fresh),
           "tt_tree")
    _chart(cached_figure(ss, "tt_row", key,
                         lambda: slot_row_figure(rp.pool_at(seq, snap.pool.num_layers), past(), tt,
                                                 *written_range(rp.pool_at(seq))), fresh), "tt_row")


__all__ = ["live_body", "request_table", "chunked_prefill_note", "last_tree_step", "Highlights"]
