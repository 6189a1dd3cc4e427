"""What a page attached to an engine server shows when the server cannot be used: why, and what to change, in
place of its views (never a traceback); the page comes back by itself once the server answers again.

A server that is not running, restarting, or refusing this dashboard's key raises ConnectionError or
ServerRefused from the HttpClient (radixui/connect/http_client.py); an in-process engine raises neither.
"""
from __future__ import annotations

from typing import Any, NoReturn

import streamlit as st

from radixui.connect.http_client import ServerRefused

SERVER_ERRORS = (ConnectionError, ServerRefused)
RETRY_S = 3.0          # how often a page that lost its server asks it again


def show_server_down(client: Any, exc: BaseException) -> NoReturn:
    """The reason in place of the page (or of the fragment that met it), a check every RETRY_S that reruns the
    page once the server answers, and the end of this run."""
    st.error(f"The engine server cannot be used: {exc}", icon=":material/cloud_off:")
    st.caption(f"This page asks it again every {RETRY_S:g} s and comes back by itself once it answers.")
    st.fragment(run_every=RETRY_S)(_retry)(client)
    st.stop()


def _retry(client: Any) -> None:
    try:
        client.versions()
    except SERVER_ERRORS:
        return
    st.rerun(scope="app")
