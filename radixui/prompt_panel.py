"""Prompt entry: raw completion or chat, sampling controls, presets; several requests in flight."""
from __future__ import annotations

import streamlit as st

from core.engine import Engine
from core.sampling import SamplingParams
from radixui.presets import PRESETS, SYSTEM_PROMPT


def _submit_all(engine: Engine, prompts: list, params: SamplingParams) -> None:
    sent = 0
    for p in prompts:
        try:
            engine.submit(p, params)
            sent += 1
        except ValueError as exc:
            st.session_state.flash = ("error", f"Request rejected: {exc}")
            return
    st.session_state.flash = ("success", f"Sent {sent} request{'s' if sent != 1 else ''}.")


def prompt_panel(engine: Engine) -> None:
    with st.form("prompt", clear_on_submit=False, border=True):
        c1, c2 = st.columns([3, 1])
        mode = c2.radio("Mode", ["Chat", "Raw completion"], horizontal=False,
                        help="Chat wraps your text in the instruct model's chat template")
        system = c2.text_input("System prompt (chat)", SYSTEM_PROMPT)
        text = c1.text_area("Prompt", placeholder="Type a prompt, then Send. Send it again, or a variation, "
                            "and watch the shared prefix light up in the tree.", height=110)
        s1, s2, s3, s4, s5 = st.columns(5)
        max_new = s1.number_input("Max new tokens", 1, 512, 24)
        temp = s2.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, help="0 = greedy")
        top_p = s3.number_input("Top p", 0.01, 1.0, 1.0, 0.05)
        top_k = s4.number_input("Top k", 0, 1000, 0, help="0 = off")
        copies = s5.number_input("Copies in flight", 1, 16, 1, help="Send the prompt this many times at once")
        sent = st.form_submit_button("Send", type="primary")
    params = SamplingParams(max_new_tokens=int(max_new), temperature=float(temp), top_p=float(top_p),
                            top_k=int(top_k))
    if sent:
        if not text.strip():
            st.session_state.flash = ("error", "Empty prompt: type some text before sending.")
        else:
            prompt = ([{"role": "system", "content": system}] if system.strip() else []) + \
                [{"role": "user", "content": text}] if mode == "Chat" else text
            _submit_all(engine, [prompt] * int(copies), params)
    p1, p2 = st.columns([3, 1])
    preset = p1.selectbox("Preset", list(PRESETS), label_visibility="collapsed")
    if p2.button("Run preset", width="stretch"):
        _submit_all(engine, PRESETS[preset][1], params)
