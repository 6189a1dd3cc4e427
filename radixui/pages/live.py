"""Live: a prompt bar beside the radix tree, one line of KPIs, evictions you can see.

Refresh work follows what changed: a small fragment polls `client.versions()` (two numbers) and
reruns the page at once when the tree changed, else when anything moved and the chosen interval
passed (radixui/panels/live_poll.py); every figure is rebuilt only when its
data changed; and the KPIs, the request table and the views all come from one snapshot (one
engine step).
"""
import streamlit as st

from radixui.panels.css import COMPACT_CSS


def render() -> None:
    st.markdown(COMPACT_CSS, unsafe_allow_html=True)
    st.title("RadixAttention, live")
    caption = st.empty()
    caption.caption("Loading the model and starting the engine...")

    from radixui.connect.resources import get_client  # noqa: E402
    from radixui.panels.controls import admin_role, engine_settings, live_controls  # noqa: E402  (after the title: imports take seconds)
    from radixui.panels.live_views import live_body  # noqa: E402
    from radixui.panels.server_down import SERVER_ERRORS, show_server_down  # noqa: E402

    client = get_client()
    try:
        admin = admin_role(client)
        engine_settings(client, admin)
        live, interval = live_controls(client, admin)
        cfg = client.config()
    except SERVER_ERRORS as exc:
        caption.empty()
        show_server_down(client, exc)
    caption.caption(f"Model `{cfg.model}` · {cfg.pool_slots:,} slots · page {cfg.page_size} · eviction "
                    f"`{cfg.eviction_policy}` · schedule `{cfg.schedule_policy}` · max prefill {cfg.max_prefill_tokens:,} "
                    f"tokens" + (" · **radix cache off**" if cfg.disable_radix_cache else "")
                    + " · the Walkthrough and the other pages, settings, step mode and reset in the sidebar (›)")


    st.fragment(live_body)(client, cfg, live, interval)   # it declares the poll (radixui/panels/live_poll.py)


if __name__ == "__main__":
    render()
