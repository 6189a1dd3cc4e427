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
    st.fragment(run_every=RETRY_S)(_retry)(client, reason(exc))
    st.stop()


def _retry(client: Any, shown: tuple[str, str]) -> None:
    if needs_rerun(client, shown):
        st.rerun(scope="app")


def reason(exc: BaseException) -> tuple[str, str]:
    """Why a call failed, whichever call it was: its kind and the server's words (a refusal's message names the
    route first: "GET /state/config failed: missing or wrong API key")."""
    return type(exc).__name__, str(exc).split(" failed: ", 1)[-1]


def needs_rerun(client: Any, shown: tuple[str, str]) -> bool:
    """Whether the page must be drawn again: the server answers, or it fails for another reason than the one
    shown (a server back up that now refuses this dashboard's key had kept "no engine server answers" on screen)."""
    try:
        client.versions()
    except SERVER_ERRORS as exc:
        return reason(exc) != shown
    return True
