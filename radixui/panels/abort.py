"""Abort from the dashboard: the selected request (under the request table), or every waiting and running
request (the sidebar, admin only: a cache reset or a rebuild needs an idle engine).

The buttons act in their callbacks, before the page's script runs, so the run they trigger already shows the
request as aborted. The inference key aborts only its own requests (the server answers 404 for another's), which
the message says.
"""
from __future__ import annotations

from typing import Optional

import streamlit as st

from core.observe.snapshot import EngineSnapshot
from radixui.connect.client import EngineClient

ACTIVE = ("waiting", "running")


def active_rids(snap: EngineSnapshot) -> list[str]:
    return [r.rid for r in snap.requests if r.state in ACTIVE]


def abort_one(client: EngineClient, rid: str) -> None:
    try:
        done = client.abort(rid)
    except (RuntimeError, PermissionError, ConnectionError) as exc:
        st.session_state.flash = ("error", f"Could not abort {rid}: {exc}")
        return
    if done:
        st.session_state.flash = ("success", f"Aborted {rid}: its slots are back in the pool.")
    else:
        st.session_state.flash = ("info", f"{rid} was not running any more"
                                          + ("" if client.is_admin() else ", or is not yours (the inference key "
                                                                          "aborts only the requests it sent)") + ".")


def abort_all(client: EngineClient) -> None:
    try:
        n = client.abort_all()
    except (RuntimeError, PermissionError, ValueError, ConnectionError) as exc:
        st.session_state.flash = ("error", f"Could not abort: {exc}")
        return
    st.session_state.flash = ("success", f"Aborted {n} request{'s' if n != 1 else ''}.") if n else \
        ("info", "Nothing to abort: no request is waiting or running.")


def abort_selected_button(client: EngineClient, snap: EngineSnapshot, selected: Optional[str]) -> None:
    """A button under the table while the selected request waits or runs."""
    if selected and selected in active_rids(snap):
        st.button(f"Abort {selected}", key="abort_selected", on_click=abort_one, args=(client, selected),
                  icon=":material/stop_circle:", help="Stop this request now; its slots go back to the pool")


def abort_all_button(client: EngineClient, admin: bool) -> None:
    st.sidebar.button("Abort all requests", width="stretch", disabled=not admin, on_click=abort_all, args=(client,),
                      help="Stop every waiting and running request (a cache reset needs an idle engine)"
                           if admin else "Needs the admin key")
