"""The Live page's poll: a fragment on the browser's timer that checks two cheap numbers.

It is declared inside the page's body fragment, so every body run (a Send included) re-declares it
at the pace the engine calls for. While requests run or wait it ticks every BUSY_POLL_S and reruns
the page as soon as the tree changed (an admission, a finish, an eviction: drawn within a tick), and
for everything else (token counts) once the chosen interval has passed since the last draw; for
BUSY_LINGER_S after the last work it ticks every LINGER_POLL_S, then every IDLE_POLL_S (or the
interval, if longer). Streamlit keeps one timer per fragment id and swaps it when the interval
changes, so a change of pace costs no extra page run.

Every tick costs the browser a re-render of the whole page, even when the poll draws nothing: React
renders each element again when a run starts and ends (measured with Chrome's profiler: ~0.1 CPU s a
tick on a 2-core box, the sidebar's ~25 widgets most of it). Hence three paces, not one.

A Send's own run draws the request table and keeps every figure as it was; the poll's next tick
(`_catch_up`) draws the figures. A changed Plotly figure is a new element to Streamlit (its id hashes
the spec), so the browser unmounts the old chart and plots the new one from scratch: ~0.5 CPU s for
the page's charts, which, drawn in the same run, held the new row back by as much."""
from __future__ import annotations

import time
from typing import Any, Iterable

import streamlit as st

from radixui.panels.server_down import SERVER_ERRORS

IDLE_POLL_S = 3.0   # while nothing runs or waits: each poll costs the browser a re-render of the page
BUSY_POLL_S = 0.25  # while something runs or waits: a tree change is drawn within this (plus one page run)
SENT_WAIT_S = 0.15  # with live refresh off, after a Send, the longest the page waits for the engine to
                    # admit what was sent (no poll will draw the branch later; a short prompt takes tens of ms)
BUSY_LINGER_S = 10.0  # a quicker pace outlasts the last work by this much: a client's next request
                      # usually follows within seconds, and its first eviction must not wait for an
                      # idle tick (a Send from this tab reruns the page by itself)
LINGER_POLL_S = 0.5   # the pace of that linger: every 0.25 s kept the browser at 40-80 % of a core for the
                      # 10 s after each request and slowed the next Send's paint; 0.5 s costs ~25 %, and a
                      # 1-s pace drew a client's evictions after a pause up to 4 s late


def poll(client: Any) -> None:
    """Reruns the page when the tree changed since the page drew, when anything else changed and the
    chosen interval has passed, or once to draw the views not drawn yet: after a tab switch, after a
    Send (whose run may have drawn a snapshot from before it), and in a new tab once its first screen
    is drawn. Called inline by the body (which is drawing the latest anyway) it does nothing."""
    ss = st.session_state
    if ss.pop("_inline_poll", False):
        return
    seen = ss.get("_drawn_version")
    catch_up = ss.pop("_catch_up", False)
    if ss.get("_catch_up_at") is not None and time.monotonic() >= ss["_catch_up_at"]:
        del ss["_catch_up_at"]
        catch_up = True
    if catch_up:
        st.rerun()
    if seen is None:
        return
    if ss.get("_poll_fast") and not ss.get("_busy") and time.monotonic() >= ss.get("_busy_until", 0.0):
        st.rerun()      # the linger is over: one page run declares the poll again, at the idle pace
    try:
        version, tree_seq = client.versions()
    except SERVER_ERRORS:
        st.rerun(scope="app")     # the page says what went wrong (server_down.py) and asks again from there
    due = time.monotonic() - ss.get("_drawn_at", 0.0) >= ss.get("_pace", 0.0) - 0.05
    if tree_seq != ss.get("_drawn_tree_seq") or (version != seen and due):
        st.rerun()


def declare_poll(client: Any, live: bool, interval: float, busy: bool) -> None:
    """Declare the poll at the pace for `busy`; with live refresh off it is not declared, so
    Streamlit stops its timer. The linger pace holds BUSY_LINGER_S after the last busy run."""
    if not live:
        return
    ss = st.session_state
    ss["_inline_poll"] = True
    ss["_pace"] = interval
    every = poll_every(ss, interval, busy, time.monotonic())
    ss["_poll_fast"] = every < max(interval, IDLE_POLL_S)   # to be slowed by one page run once the linger ends
    st.fragment(run_every=every)(poll)(client)


def poll_every(ss: dict, interval: float, busy: bool, now: float) -> float:
    """Seconds between ticks for a page run at `now` that saw the engine `busy` (or not); a busy run
    starts the linger, recorded in `ss` (session_state), where the poll reads when it ends."""
    if busy:
        ss["_busy_until"] = now + BUSY_LINGER_S
        return min(interval, BUSY_POLL_S)
    if now < ss.get("_busy_until", 0.0):
        return min(interval, LINGER_POLL_S)
    return max(interval, IDLE_POLL_S)


def admitted_snapshot(client: Any, rids: Iterable[str], stepping: bool) -> Any:
    """The snapshot for a page run, recording in session_state what the poll compares against (the
    version and tree seq read just before it, and when). Given `rids` (a Send with live refresh off,
    where no poll tick follows): the first snapshot in which every request just sent has left the
    queue (its prompt prefilled, so its branch is in the tree), waiting at most SENT_WAIT_S; in step
    mode nothing is admitted until Step, so nothing is waited for."""
    rids = set(rids)
    deadline = time.monotonic() + (0.0 if stepping or not rids else SENT_WAIT_S)
    ss = st.session_state
    while True:
        ss["_drawn_version"], ss["_drawn_tree_seq"] = client.versions()
        ss["_drawn_at"] = time.monotonic()
        snap = client.snapshot()
        states = {r.rid: r.state for r in snap.requests}
        if time.monotonic() >= deadline or all(states.get(rid) not in (None, "waiting") for rid in rids):
            return snap
        time.sleep(0.02)
