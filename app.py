"""RadixAttention, live: `streamlit run app.py`.

One engine runs in its own thread (held with st.cache_resource, shared by every tab); the
pages only read its snapshots and call its public methods.
"""
import streamlit as st

st.set_page_config(page_title="RadixAttention live", page_icon=":material/account_tree:", layout="wide")

pages = [
    st.Page("radixui/pages/live.py", title="Live", icon=":material/account_tree:", default=True),
    st.Page("radixui/pages/walkthrough.py", title="Walkthrough", icon=":material/menu_book:"),
    st.Page("radixui/pages/capacity.py", title="Capacity lab", icon=":material/monitoring:"),
    st.Page("radixui/pages/replicas.py", title="Replicas", icon=":material/lan:"),
]
st.navigation(pages).run()
