"""Sidebar controls of the Live page: engine settings (rebuild), abort all, reset, refresh and step mode.
Everything goes through the EngineClient, so the same sidebar drives a local or a remote engine."""
from __future__ import annotations

import dataclasses
from typing import Any

import streamlit as st

from core.engine.config import FORM_FIELDS, describe_choice, form_options
from radixui.connect.client import EngineClient
from radixui.panels.abort import abort_all_button


ADMIN_NOTE = ("Signed in with the inference key (RADIX_API_KEY): the engine settings, step mode, abort all and "
              "reset cache change the engine for everyone and need the admin key. Start the dashboard with "
              "RADIX_ADMIN_KEY set to use them.")


def admin_role(client: EngineClient) -> bool:
    """Whether this tab may use the admin controls: the server says so, unless it already refused one
    (an older server that does not say), which the tab remembers."""
    if st.session_state.get("_admin_refused"):
        return False
    try:
        return client.is_admin()
    except ConnectionError:
        raise                  # no server, or one that does not answer: the page says so (server_down.py)
    except (RuntimeError, OSError):
        return True            # an older server that does not say: keep the controls, their calls report refusals


def _refused(exc: PermissionError) -> None:
    st.session_state["_admin_refused"] = str(exc)
    st.session_state.flash = ("warning", f"{exc}. {ADMIN_NOTE}")


def engine_settings(client: EngineClient, admin: bool = True) -> None:
    """The engine's settings form, one widget per EngineConfig setting that has one; Apply rebuilds.
    Without the admin role the form shows the settings, disabled, under a note saying why."""
    cfg = client.config()
    if not admin:
        st.sidebar.info(ADMIN_NOTE, icon=":material/lock:")
    with st.sidebar.form("engine_settings"):
        st.markdown("**Engine** (applying rebuilds it)")
        values = {f.name: _widget(f, getattr(cfg, f.name), not admin) for f in FORM_FIELDS}
        if st.form_submit_button("Apply", width="stretch", disabled=not admin):
            values["model"] = values["model"].strip() or "default"
            try:
                new = cfg.replace(**values).validate()
            except ValueError as exc:
                st.session_state.flash = ("error", f"Engine not changed: {exc}")
                return
            unfinished = _unfinished(client)
            err = client.rebuild(new)
            if err:
                st.session_state.flash = ("error", f"Engine not changed: {err}")
            else:
                lost = forget_my_requests(st.session_state) | unfinished
                st.session_state["_engine_applied"] = True     # this tab's own rebuild: said here, not again
                st.session_state.flash = ("success", f"Engine rebuilt: {new.pool_slots} slots, {new.eviction_policy}"
                                          + (f"; {len(lost)} unfinished request{'s' if len(lost) != 1 else ''} "
                                             f"went with the old engine" if lost else ""))
                st.session_state.pop("tt_seq", None)


def _unfinished(client: EngineClient) -> set:
    """The rids the engine lists as waiting or running: a rebuild ends them with the old engine."""
    try:
        return {r.rid for r in client.snapshot().requests if r.state in ("waiting", "running")}
    except (RuntimeError, OSError):
        return set()


def forget_my_requests(ss) -> set:
    """After a rebuild: the requests this tab sent that no snapshot listed yet never will (the new
    engine starts empty), so they leave the table instead of staying "submitted" forever."""
    lost = set(ss.get("my_requests", {}))
    ss["my_requests"] = {}
    return lost


def _widget(f: dataclasses.Field, value: Any, disabled: bool = False) -> Any:
    label, help_ = f.metadata["label"], f.metadata["help"]
    kind = f.metadata["form"]
    if kind == "text":
        return st.text_input(label, value, help=help_, disabled=disabled)
    if kind == "number":
        return int(st.number_input(label, min_value=f.metadata["minimum"] or 0, max_value=10_000_000, value=int(value),
                                   step=64 if f.name == "pool_slots" else 1, help=help_, disabled=disabled))
    if kind == "checkbox":
        return st.checkbox(label, value, help=help_, disabled=disabled)
    options = form_options(f)
    if value not in options:
        options.append(value)
    return st.selectbox(label, options, index=options.index(value), help=help_, disabled=disabled,
                        format_func=lambda v: describe_choice(f.name, v))


def live_controls(client: EngineClient, admin: bool = True) -> tuple[bool, float]:
    """Returns (live refresh on, poll interval s). Step mode stops the engine loop. Step mode, Step and
    Reset cache need the admin role: without it they are disabled (the note above the settings says
    why), and a refusal the server still sends is a message, never a traceback."""
    sb = st.sidebar
    sb.markdown("**View**")
    live = sb.toggle("Live refresh", value=True, help="Pause to freeze the views while you read them")
    interval = sb.select_slider("Check for changes every", options=[0.25, 0.5, 1.0, 2.0], value=1.0,
                                format_func=lambda s: f"{s:g} s",
                                help="The page polls a cheap version number and redraws only when the engine changed; every poll also costs the browser a repaint, so while nothing runs or waits it polls every 3 s (or this, if longer)")
    stepping = client.is_stepping()
    step_mode = sb.toggle("Step mode", value=stepping, disabled=not admin,
                          help="Stop the engine thread and advance one scheduler step per click"
                               + ("" if admin else " (needs the admin key)"))
    if step_mode != stepping and admin:
        try:
            client.set_step_mode(step_mode)
        except PermissionError as exc:
            _refused(exc)
            step_mode = stepping
    if step_mode and sb.button("Step", width="stretch", disabled=not admin,
                               help="One scheduler step: admit, batch, sample, cache"):
        try:
            if not client.step():
                st.session_state.flash = ("info", "Nothing to do: no request is waiting or running.")
        except PermissionError as exc:
            _refused(exc)
    abort_all_button(client, admin)
    if sb.button("Reset cache", width="stretch", disabled=not admin,
                 help=None if admin else "Needs the admin key"):
        err = client.reset_cache()
        if err:
            st.session_state.flash = ("error", err)
        else:
            st.session_state.pop("tt_seq", None)
            st.session_state.flash = ("success", "Cache reset: the tree is empty and every slot is free.")
    return live, interval
