"""RadixAttention, live: `streamlit run app.py`.

The pages reach the engine only through `radixui.connect.resources.get_client()`: an engine in this process
(its own thread, shared by every tab), or `python -m core.server` when RADIX_ENGINE_URL is set.
"""
import pathlib

import streamlit as st

from radixui.connect.origin import foreign_origin

ICON = str(pathlib.Path(__file__).parent / "radixui" / "static" / "favicon.png")  # local: works offline

st.set_page_config(page_title="RadixAttention live", page_icon=ICON, layout="wide",
                   initial_sidebar_state="collapsed")
refusal = foreign_origin(st.context.headers, st.get_option("server.corsAllowedOrigins"))   # before anything is drawn
if refusal:
    st.error(refusal)
    st.stop()

pages = [
    st.Page("radixui/pages/live.py", title="Live", icon=":material/account_tree:", default=True),
    st.Page("radixui/pages/walkthrough.py", title="Walkthrough", icon=":material/menu_book:"),
    st.Page("radixui/pages/capacity.py", title="Capacity lab", icon=":material/monitoring:"),
    st.Page("radixui/pages/replicas.py", title="Replicas", icon=":material/lan:"),
    st.Page("radixui/pages/kv_events.py", title="KV events", icon=":material/podcasts:"),
]
st.navigation(pages).run()
