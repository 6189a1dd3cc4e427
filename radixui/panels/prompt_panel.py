"""The compact prompt bar: text, mode, sampling, priority, cache namespace, presets.

Send and "Run preset" are both submit buttons of one form, so a preset runs with the values in
the form (max new tokens, temperature, ...) as they are on screen, not as they were at the last
Send. Both submit in the buttons' callback, before the page's script runs, so the page can send
the request table ahead of the form's widgets: the new row is the first thing the browser draws.
Number fields have no browser-side limits: an out-of-range value reaches `form_params`, which
names the field and the range, instead of the browser silently refusing the click. (Past 2**53, where
JavaScript's numbers stop being exact integers, Streamlit's field itself keeps the last value.)
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional, Union

import streamlit as st

from core.engine.sampling import SamplingParams
from radixui.connect.client import EngineClient
from radixui.panels.presets import PRESETS, SYSTEM_PROMPT
from radixui.panels.server_down import SERVER_ERRORS

MAX_COPIES = 64


def _whole(name: str, value: Any, lo: int, hi: Optional[int] = None) -> int:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and float(value).is_integer() and value >= lo and (hi is None or value <= hi)
    if not ok:
        span = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"
        raise ValueError(f"{name} must be a whole number {span}; got {value!r}. Change it and send again.")
    return int(value)


def _real(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        raise ValueError(f"{name} must be {'above' if lo_open else 'at least'} {lo:g} and at most {hi:g}; "
                         f"got {value!r}. Change it and send again.")
    return float(value)


def form_params(max_new: Any, temperature: Any, top_p: Any, top_k: Any, copies: Any,
                priority: Any) -> tuple[SamplingParams, int]:
    """The form's fields as SamplingParams and a copy count; ValueError naming the bad field."""
    params = SamplingParams(max_new_tokens=_whole("Max new tokens", max_new, 1),
                            temperature=_real("Temperature", temperature, 0.0, 2.0),
                            top_p=_real("Top p", top_p, 0.0, 1.0, lo_open=True),
                            top_k=_whole("Top k", top_k, 0), priority=_whole("Priority", priority, -10**6, 10**6))
    return params, _whole("Copies", copies, 1, MAX_COPIES)


def build_prompt(text: str, mode: str, system: str) -> Union[str, list]:
    if mode == "Chat":
        return ([{"role": "system", "content": system}] if system.strip() else []) + [{"role": "user", "content": text}]
    return text


def submit_all(client: EngineClient, prompts: list, params: SamplingParams, extra_key: Optional[str]) -> None:
    """Submit every prompt; the rids go to session_state (the table shows them at once, before
    the engine's next snapshot); the first rejection stops and is shown as an error."""
    mine = st.session_state.setdefault("my_requests", {})
    rids: list[str] = []
    # the rids just sent: the page turns busy at once, and its run waits (briefly) for their admission
    st.session_state["_sent"] = rids
    for p in prompts:
        try:
            rid = client.submit(p, params, extra_key=extra_key)
        except (ValueError, *SERVER_ERRORS) as exc:     # a callback: what went wrong is a message, not a traceback
            sent = len(rids)
            st.session_state.flash = ("error", f"Request rejected: {exc}" + (f" ({sent} sent before it)" if sent else ""))
            return
        mine[rid] = (p if isinstance(p, str) else p[-1]["content"], time.time())
        rids.append(rid)
    sent = len(rids)
    st.session_state.flash = ("success", f"Sent {sent} request{'s' if sent != 1 else ''}.")


def _on_submit(client: EngineClient, run_preset: bool) -> None:
    """The form's submit callback: it runs before the page's script, so the new request is in the
    table the moment the page draws it (the table is sent before the form's own widgets)."""
    ss = st.session_state
    try:
        params, n_copies = form_params(ss["pp_max_new"], ss["pp_temp"], ss["pp_top_p"], ss["pp_top_k"],
                                       ss["pp_copies"], ss["pp_priority"])
    except ValueError as exc:
        ss.flash = ("error", str(exc))
        return
    extra_key = ss["pp_namespace"].strip() or None
    if run_preset:
        submit_all(client, list(PRESETS[ss["pp_preset"]][1]), params, extra_key)
    elif not ss["pp_text"].strip():
        ss.flash = ("error", "Empty prompt: type some text before sending.")
    else:
        submit_all(client, [build_prompt(ss["pp_text"], ss["pp_mode"], ss["pp_system"])] * n_copies, params,
                   extra_key)


def prompt_panel(client: EngineClient) -> None:
    """The form; Send and Run preset submit through `_on_submit` (see there why)."""
    with st.form("prompt", clear_on_submit=False, border=True):
        st.text_area("Prompt", placeholder="Type a prompt, then Send. Send it again, or a variation, "
                     "and watch the shared prefix light up in the tree.", height=68, key="pp_text",
                     label_visibility="collapsed")
        m, more = st.columns([1.6, 1], vertical_alignment="center")
        m.radio("Mode", ["Chat", "Raw completion"], horizontal=True, label_visibility="collapsed",
                help="Chat wraps your text in the instruct model's chat template", key="pp_mode")
        # sampling and the rest in a popover, not an expander: one row less, so the hit-rate chart
        # stays on a 900 px screen, and it opens at full width instead of inside the form's column
        with more.popover("Sampling…", width="stretch", icon=":material/tune:",
                          help="Temperature, top p, top k, the system prompt (chat) and the cache namespace"):
            s1, s2, s3 = st.columns(3)
            s1.number_input("Temperature", value=0.0, step=0.1, min_value=None, max_value=None, key="pp_temp",
                            help="0 = greedy")
            s2.number_input("Top p", value=1.0, step=0.05, min_value=None, max_value=None, key="pp_top_p")
            s3.number_input("Top k", value=0, step=1, min_value=None, max_value=None, key="pp_top_k", help="0 = off")
            st.text_input("System prompt (chat)", SYSTEM_PROMPT, key="pp_system")
            st.text_input("Cache namespace (extra_key)", "", key="pp_namespace",
                          help="Requests share cached prefixes only within one namespace "
                               "(SGLang's extra_key, e.g. one per LoRA or tenant)")
        n, c, pr = st.columns(3)
        n.number_input("Max new tokens", value=24, step=1, min_value=None, max_value=None, key="pp_max_new")
        c.number_input("Copies", value=1, step=1, min_value=None, max_value=None, key="pp_copies",
                       help=f"Send the prompt this many times at once (1-{MAX_COPIES})")
        pr.number_input("Priority", value=0, step=1, min_value=None, max_value=None, key="pp_priority",
                        help="SamplingParams.priority: the 'priority' eviction policy keeps "
                             "high-priority prefixes longer")
        b1, b2, b3 = st.columns([0.8, 1.7, 1.1], vertical_alignment="bottom")
        b1.form_submit_button("Send", type="primary", width="stretch", on_click=_on_submit, args=(client, False))
        b2.selectbox("Preset", list(PRESETS), label_visibility="collapsed", key="pp_preset")
        b3.form_submit_button("Run preset", width="stretch", on_click=_on_submit, args=(client, True),
                              help="Send the preset's prompts with the values in this form")
