"""Live: type prompts and watch the radix tree, the slot pool, the eviction heap and the events."""
import pandas as pd
import streamlit as st

from core.snapshot import EngineSnapshot
from radixui.controls import engine_settings, live_controls
from radixui.events import EVENT_KINDS, event_table, style_event_table
from radixui.fmt import token_text_from_map
from radixui.heap import eviction_figure, eviction_table
from radixui.metrics import render_kpis
from radixui.prompt_panel import prompt_panel
from radixui.replay import Replayer, empty_snapshot
from radixui.slots import kv_heatmap, slot_row_figure
from radixui.state import get_holder
from radixui.tree import step_highlights, tree_figure, tree_overview

holder = get_holder()
engine = holder.get()
engine_settings(holder)
live, interval = live_controls(holder)

st.title("RadixAttention, live")
cfg = holder.config
st.caption(f"Model `{cfg.model}` · {cfg.pool_slots:,} slots · page {cfg.page_size} · eviction `{cfg.eviction_policy}` "
           f"· schedule `{cfg.schedule_policy}`" + (" · **radix cache off**" if cfg.disable_radix_cache else ""))
flash_box = st.container()
prompt_panel(engine)
flash = st.session_state.pop("flash", None)  # set by the controls and the prompt panel in this run
if flash:
    getattr(flash_box, flash[0])(flash[1])


VIEWS = ["Radix tree", "Slot pool", "Eviction heap", "Event log", "Time travel"]


def request_table(snap: EngineSnapshot) -> pd.DataFrame:
    rows = [{"request": r.rid, "state": r.state, "prompt tokens": r.prompt_tokens, "cached tokens": r.cached_tokens,
             "new tokens": r.output_tokens, "TTFT (s)": None if r.ttft is None else round(r.ttft, 3),
             "finish": r.finish_reason or "", "output": r.output_text if not r.error else f"error: {r.error}"}
            for r in reversed(snap.requests)]
    return pd.DataFrame(rows, columns=["request", "state", "prompt tokens", "cached tokens", "new tokens",
                                       "TTFT (s)", "finish", "output"])


def last_tree_step(events: list) -> list:
    """The events of the latest step that changed the tree, so its colours stay until the next change
    (decode steps only allocate slots and would otherwise wash the highlights out at once)."""
    changed = [e.time for e in events if e.kind in ("match", "split", "insert", "evict", "reset")]
    return [e for e in events if changed and e.time == changed[-1]]


def cached_figure(name: str, key: tuple, build):
    """Rebuild a figure only when its inputs changed (the snapshot seq or the view options)."""
    store = st.session_state.setdefault("_figs", {})
    if store.get(name, (None,))[0] != key:
        store[name] = (key, build())
    return store[name][1]


@st.fragment(run_every=interval if live else None)
def live_views() -> None:
    snap = engine.snapshot(wait=False)
    tt = token_text_from_map(snap.token_text)
    if engine.last_error:
        st.warning(f"The engine recovered from an error: {engine.last_error}")
    render_kpis(st, snap.metrics, columns=5)
    st.session_state.refreshes = st.session_state.get("refreshes", 0) + 1
    st.markdown(f"**Requests** · step {snap.step} · time {snap.cache.time:g} · "
                f"<span style='color:#888'>refresh {st.session_state.refreshes}</span>", unsafe_allow_html=True)
    st.dataframe(request_table(snap), hide_index=True, width="stretch", height=min(36 * (len(snap.requests) + 1) + 3, 250))
    hl = step_highlights(last_tree_step(engine.events_since(max(0, snap.seq - 2000))))
    # one view at a time: only the chosen one is built on each refresh (st.tabs would build all five)
    view = st.segmented_control("View", VIEWS, default=VIEWS[0], key="live_view",
                                label_visibility="collapsed") or VIEWS[0]
    if view == "Radix tree":
        c1, c2 = st.columns([1, 3])
        shape = c1.radio("Draw", ["Tree", "Overview (sized by tokens)"], key="tree_view", horizontal=True)
        ids = [n.id for n in snap.cache.nodes]
        focus = c2.selectbox("Focus on subtree", [None] + ids[1:], key="tree_focus",
                             format_func=lambda i: "whole tree" if i is None else f"node {i}")
        if focus is not None and focus not in ids:
            focus = None
        if shape == "Tree":
            fig = cached_figure("tree", (snap.seq, focus), lambda: tree_figure(snap.cache, tt, hl, focus=focus))
        else:
            fig = cached_figure("overview", (snap.seq,), lambda: tree_overview(snap.cache, tt, hl))
        st.plotly_chart(fig, width="stretch", key="tree_chart")
    elif view == "Slot pool":
        size = snap.pool.num_slots + snap.pool.page_size
        lo, hi = st.slider("Slot range", 0, size, (0, size), key="slot_range",
                           help="Narrow the range to see every slot at full resolution")
        st.plotly_chart(cached_figure("row", (snap.seq, lo), lambda: slot_row_figure(snap.pool, snap.cache, tt, lo=lo)),
                        width="stretch", key="slot_row")
        st.plotly_chart(cached_figure("heat", (snap.seq, lo, hi), lambda: kv_heatmap(snap.pool, lo, hi)),
                        width="stretch", key="heatmap")
    elif view == "Eviction heap":
        st.caption(f"Policy `{snap.cache.policy}`: the order evict() would take nodes, next victim first.")
        st.plotly_chart(cached_figure("heap", (snap.seq,), lambda: eviction_figure(snap.cache, tt)),
                        width="stretch", key="heap_chart")
        st.dataframe(eviction_table(snap.cache, tt, limit=200), hide_index=True, width="stretch")
    elif view == "Event log":
        kinds = st.multiselect("Event types", list(EVENT_KINDS), default=list(EVENT_KINDS), key="log_kinds")
        df = event_table(engine.events_since(max(0, snap.seq - 2000)), tt, kinds=kinds, limit=300)
        st.dataframe(style_event_table(df), hide_index=True, width="stretch", height=360)
    elif view == "Time travel":
        time_travel(snap, tt)


def time_travel(snap: EngineSnapshot, tt) -> None:
    events = engine.events_since(0)
    resets = [e.seq for e in events if e.kind == "reset"]
    start = resets[-1] if resets else 0
    events = [e for e in events if e.seq > start]
    if not events:
        st.info("No events yet: send a prompt, then slide through its history here.")
        return
    if events[0].seq != start + 1:
        st.warning("The event ring has dropped the oldest events; time travel covers only the cache since a reset.")
        return
    initial = empty_snapshot(snap.cache.num_slots, snap.cache.page_size, snap.cache.policy, seq=start)
    seq = st.slider("After event", events[0].seq, events[-1].seq, events[-1].seq, key="tt_seq")
    rp = Replayer(initial, events)
    past = rp.at(seq)
    ev = next(e for e in events if e.seq == seq)
    st.markdown(f"**Event {seq}** at time {ev.time:g}: {ev.kind}")
    st.plotly_chart(tree_figure(past, tt, step_highlights([ev])), width="stretch", key="tt_tree")
    st.plotly_chart(slot_row_figure(rp.pool_at(seq, snap.pool.num_layers), past, tt), width="stretch", key="tt_row")


live_views()
