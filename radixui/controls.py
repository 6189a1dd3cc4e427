"""Sidebar controls of the Live page: engine settings (rebuild), reset, refresh and step mode.
Everything goes through the EngineClient, so the same sidebar drives a local or a remote engine."""
from __future__ import annotations

import streamlit as st

from core.eviction import DESCRIPTIONS, POLICIES
from core.scheduler import SCHEDULE_POLICIES
from radixui.client import EngineClient
from radixui.state import EngineConfig


def engine_settings(client: EngineClient) -> None:
    cfg = client.config() or EngineConfig()
    with st.sidebar.form("engine_settings"):
        st.markdown("**Engine** (applying rebuilds it)")
        model = st.text_input("Model", cfg.model, help="'default' (SmolLM2-135M-Instruct), a local Hugging Face "
                                                        "folder, or a .gguf file")
        pool = st.number_input("Pool size (slots)", min_value=1, max_value=1_000_000, value=cfg.pool_slots, step=64)
        policy = st.selectbox("Eviction policy", list(POLICIES), index=list(POLICIES).index(cfg.eviction_policy),
                              format_func=lambda p: f"{p}: {DESCRIPTIONS[p]}")
        page = st.selectbox("Page size", [1, 2, 4, 8, 16], index=[1, 2, 4, 8, 16].index(cfg.page_size))
        sched = st.selectbox("Schedule policy", list(SCHEDULE_POLICIES),
                             index=list(SCHEDULE_POLICIES).index(cfg.schedule_policy),
                             help="lpm: longest prefix match first (SGLang); fcfs: arrival order")
        no_cache = st.checkbox("Disable radix cache (baseline)", cfg.disable_radix_cache)
        if st.form_submit_button("Apply", width="stretch"):
            new = EngineConfig(model=model.strip() or "default", pool_slots=int(pool), page_size=int(page),
                               eviction_policy=policy, schedule_policy=sched,
                               max_running_requests=cfg.max_running_requests,
                               max_prefill_tokens=cfg.max_prefill_tokens, disable_radix_cache=no_cache)
            err = client.rebuild(new)
            if err:
                st.session_state.flash = ("error", f"Engine not changed: {err}")
            else:
                st.session_state.flash = ("success", f"Engine rebuilt: {new.pool_slots} slots, {new.eviction_policy}")
                st.session_state.pop("tt_seq", None)


def live_controls(client: EngineClient) -> tuple[bool, float]:
    """Returns (live refresh on, poll interval s). Step mode stops the engine loop."""
    sb = st.sidebar
    sb.markdown("**View**")
    live = sb.toggle("Live refresh", value=True, help="Pause to freeze the views while you read them")
    interval = sb.select_slider("Check for changes every", options=[0.25, 0.5, 1.0, 2.0], value=1.0,
                                format_func=lambda s: f"{s:g} s",
                                help="The page polls a cheap version number and redraws only when the engine changed; every poll also costs the browser a repaint, so while nothing runs or waits it polls every 3 s (or this, if longer)")
    stepping = client.is_stepping()
    step_mode = sb.toggle("Step mode", value=stepping,
                          help="Stop the engine thread and advance one scheduler step per click")
    if step_mode != stepping:
        client.set_step_mode(step_mode)
    if step_mode and sb.button("Step", width="stretch", help="One scheduler step: admit, batch, sample, cache"):
        if not client.step():
            st.session_state.flash = ("info", "Nothing to do: no request is waiting or running.")
    if sb.button("Reset cache", width="stretch"):
        err = client.reset_cache()
        if err:
            st.session_state.flash = ("error", err)
        else:
            st.session_state.pop("tt_seq", None)
            st.session_state.flash = ("success", "Cache reset: the tree is empty and every slot is free.")
    return live, interval
