"""The article's walkthrough on the real engine: pool of 11 slots, four prompts, one token each."""
import streamlit as st

from core.engine.walkthrough import ARTICLE_POOL_SLOTS
from core.observe.token_bytes import TokenDecoder
from radixui.connect.resources import get_client, get_walkthrough
from radixui.figures.heap import eviction_table
from radixui.figures.highlights import ghosts_from_events
from radixui.figures.narrate import article_token_note, explain_step
from radixui.figures.slots import slot_row_figure
from radixui.figures.tree import step_highlights, tree_figure
from radixui.panels.css import COMPACT_CSS
from radixui.panels.server_down import SERVER_ERRORS, show_server_down


def _go(delta, last: int) -> None:
    """Move the walkthrough by `delta` steps (None: back to the start), kept within 0..last."""
    ss = st.session_state
    ss.wt_step = 0 if delta is None else min(last, max(0, ss.get("wt_step", 0) + delta))


def render() -> None:
    st.markdown(COMPACT_CSS, unsafe_allow_html=True)
    st.title("Walkthrough: the article, step by step, on the real model")
    st.caption(f"A pool of {ARTICLE_POOL_SLOTS} slots; each request generates one token and finishes, so only its "
               "prompt is cached. Every number below is read from the engine after that step.")

    client = get_client()
    try:
        model = client.config().model
    except SERVER_ERRORS as exc:
        show_server_down(client, exc)
    try:
        steps = get_walkthrough(model)
    except ValueError as exc:
        st.error(f"The walkthrough could not run: {exc}")
        st.stop()

    if "wt_step" not in st.session_state:
        st.session_state.wt_step = 0
    last = len(steps) - 1
    c1, c2, c3, _ = st.columns([1, 1, 1, 5])
    # The clicks move the step in callbacks, which run before this script: each button's enabled
    # state is then computed from the step on screen, not from the one before the click.
    at = st.session_state.wt_step
    c1.button("◀ Back", disabled=at == 0, width="stretch", key="wt_back", on_click=_go, args=(-1, last))
    c2.button("Next ▶", disabled=at == last, width="stretch", key="wt_next", on_click=_go, args=(1, last))
    c3.button("Restart", width="stretch", key="wt_restart", on_click=_go, args=(None, last))

    step = steps[st.session_state.wt_step]
    snap = step.snapshot
    tt = TokenDecoder(snap.token_text)
    if step.time is None:
        st.subheader("Start: an empty tree, free_pages = 1 … 11")
        st.write("Press **Next** to send the first request.")
    else:
        st.subheader(f"Time {step.time}: “{step.prompt}”")
        st.markdown(" ".join(f"`{t}`" for t in step.tokens) + f" — {len(step.tokens)} tokens")
        lines = explain_step(step.events, snap.cache, snap.pool, tt, step.completion.prompt_tokens,
                             step.completion.cached_tokens)
        note = article_token_note(step.tokens, step.completion.cached_tokens, step.events)
        st.markdown("\n".join(f"{i}. {line}" for i, line in enumerate(lines, 1)))
        if note:
            st.info(note)

    left, right = st.columns([3, 2])
    with left:
        st.plotly_chart(tree_figure(snap.cache, tt, step_highlights(step.events), width=760,
                                    ghosts=ghosts_from_events(step.events, steps=1),
                                    title=f"Radix tree at time {step.time if step.time is not None else '–'}"),
                        width="stretch", key=f"wt_tree_{st.session_state.wt_step}")
    with right:
        st.markdown("**Eviction heap** (the evictable leaves, next victim first)")
        order = eviction_table(snap.cache, tt)
        # the heap holds leaves only (the article's evictable_leaves); a node with children joins it once
        # they are gone, so it is named under the table, not listed as if it could go now
        leaf = order["leaf_now"].astype(bool)
        heap = order[leaf].assign(order=lambda d: range(1, len(d) + 1))
        heap = heap[["order", "node", "last_access_time", "tokens", "text", "slots"]]
        if heap.empty:
            st.caption("Empty: no evictable leaf yet.")
        else:   # a static table: every column shown and text wrapped, nothing clipped; "order" a column
            # of its own (as an index it lost its header, and from Time 1 the browser dropped it)
            st.table(heap.rename(columns={"last_access_time": "last used"}), hide_index=True)
        later = order[~leaf]
        if not later.empty:
            st.caption("Then, once their children are gone: " +
                       ", ".join(f"node {r.node} ({r.text!r})" for r in later.itertuples()))
        st.markdown(f"**free_pages**: `{list(snap.cache.free_pages)}`")
    st.plotly_chart(slot_row_figure(snap.pool, snap.cache, tt, title="Slot row (struck through: free but stale)"),
                    width="stretch", key=f"wt_slots_{st.session_state.wt_step}")


if __name__ == "__main__":
    render()
