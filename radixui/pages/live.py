"""Live: a prompt bar beside the radix tree, one line of KPIs, evictions you can see.

Refresh work follows what changed: a small fragment polls `client.version()` (a number) and
reruns the page only when it moved; every figure is rebuilt only when its data changed; and the
KPIs, the request table and the views all come from one snapshot (one engine step).
"""
import time

import streamlit as st

from radixui.layout_css import COMPACT_CSS

st.markdown(COMPACT_CSS, unsafe_allow_html=True)
st.title("RadixAttention, live")
caption = st.empty()
caption.caption("Loading the model and starting the engine...")

from radixui.controls import engine_settings, live_controls  # noqa: E402  (after the title: imports take seconds)
from radixui.live_views import live_body  # noqa: E402
from radixui.state import get_client  # noqa: E402

client = get_client()
engine_settings(client)
live, interval = live_controls(client)
cfg = client.config()
caption.caption(f"Model `{cfg.model}` · {cfg.pool_slots:,} slots · page {cfg.page_size} · eviction "
                f"`{cfg.eviction_policy}` · schedule `{cfg.schedule_policy}` · max prefill {cfg.max_prefill_tokens:,} "
                f"tokens" + (" · **radix cache off**" if cfg.disable_radix_cache else "")
                + " · the Walkthrough and the other pages, settings, step mode and reset in the sidebar (›)")


IDLE_POLL_S = 3.0   # while nothing runs or waits: each poll costs the browser a re-render of the page
every = interval if st.session_state.get("_busy", False) else max(interval, IDLE_POLL_S)


@st.fragment(run_every=every if live else None)
def poll() -> None:
    """Cheap: one version number. The page reruns only when the engine changed since it drew, or
    once to draw the views not drawn yet: after a tab switch, and in a new tab once its first
    screen is drawn (on its own timer only: in a full run the body below is about to draw the
    latest anyway). It polls every `interval` while the engine works and every IDLE_POLL_S while
    it is quiet; the body reruns the page when the engine turns busy or quiet, so the new pace
    applies at once."""
    ss = st.session_state
    if ss.pop("_full_run", False):
        return
    seen = ss.get("_drawn_version")
    catch_up = ss.pop("_catch_up", False)
    if ss.get("_catch_up_at") is not None and time.monotonic() >= ss["_catch_up_at"]:
        catch_up = ss.pop("_catch_up_at") is not None
    if catch_up or (seen is not None and client.version() != seen):
        st.rerun()


st.session_state["_full_run"] = True
poll()
st.fragment(live_body)(client, cfg)
