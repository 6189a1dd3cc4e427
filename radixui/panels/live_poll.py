"""The Live page's poll: a fragment on the browser's timer that checks one cheap version number.

It is declared inside the page's body fragment, so every body run (a Send included) re-declares it
at the pace the engine calls for: `interval` while requests run or wait, IDLE_POLL_S while it is
quiet. Streamlit keeps one timer per fragment id and swaps it when the interval changes, so a
change of pace costs no extra page run."""
from __future__ import annotations

import time
from typing import Any

import streamlit as st

IDLE_POLL_S = 3.0   # while nothing runs or waits: each poll costs the browser a re-render of the page


def poll(client: Any) -> None:
    """Reruns the page only when the engine changed since the page drew, or once to draw the views
    not drawn yet: after a tab switch, after a Send (whose run may have drawn a snapshot from before
    it), and in a new tab once its first screen is drawn. Called inline by the body (which is
    drawing the latest anyway) it does nothing."""
    ss = st.session_state
    if ss.pop("_inline_poll", False):
        return
    seen = ss.get("_drawn_version")
    catch_up = ss.pop("_catch_up", False)
    if ss.get("_catch_up_at") is not None and time.monotonic() >= ss["_catch_up_at"]:
        del ss["_catch_up_at"]
        catch_up = True
    if catch_up or (seen is not None and client.version() != seen):
        st.rerun()


def declare_poll(client: Any, live: bool, interval: float, busy: bool) -> None:
    """Declare the poll at the pace for `busy`; with live refresh off it is not declared, so
    Streamlit stops its timer."""
    if not live:
        return
    st.session_state["_inline_poll"] = True
    st.fragment(run_every=interval if busy else max(interval, IDLE_POLL_S))(poll)(client)
