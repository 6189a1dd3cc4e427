"""Capacity lab, section 1: the workload to replay (a preset generator, an uploaded trace, or a bundled
Mooncake trace) and the capacities and page size that suit it."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import streamlit as st

from core.lab.chat_traces import DEFAULT_SESSIONS, ChatTokenizer, hf_chat
from core.lab.traces import MOONCAKE_BLOCK, load_mooncake, order_notes
from core.lab.units import plural
from core.lab.workloads import GENERATORS, Workload
from radixui.connect.resources import DEFAULT_MODEL, get_holder, get_runner
from radixui.panels import lab_inputs as li

SOURCES = ["Preset workload", "Upload a trace", "Bundled Mooncake trace"]


@dataclass
class WorkloadChoice:
    workload: Workload
    default_caps: Optional[str]     # capacities that suit it (None: suggest from its size)
    default_ps: int                 # its natural page size (a block trace's block size)
    source_key: str                 # names the widgets that depend on this workload


@st.cache_resource(show_spinner="Reading the Mooncake trace...")
def _mooncake(path: str, mtime: float):
    return load_mooncake(path)


def model_name() -> str:
    """The model of the in-process engine the lab tokenizes text and runs prompts with."""
    holder = get_holder()
    return holder.config.model if holder.config else DEFAULT_MODEL


def _tokenize(text: str) -> list:
    """Text lines of an uploaded trace: the engine's tokenizer (loads the model once, on first use)."""
    return get_runner(model_name()).tokenizer.encode(text)     # as the engine reads text


class _EngineChat:
    """Chat lines of an uploaded trace: the engine's chat template and stop tokens, the model loaded only when a
    chat needs it (then once)."""

    def __init__(self) -> None:
        self._resolved: Optional[ChatTokenizer] = None

    def _chat(self) -> ChatTokenizer:
        if self._resolved is None:
            runner = get_runner(model_name())
            chat = hf_chat(runner.tokenizer, runner.eos_token_ids)
            if chat is None:
                raise ValueError(f"the model {model_name()!r} has no chat template; upload token ids or texts")
            self._resolved = chat
        return self._resolved

    def template(self, messages: list, generation_prompt: bool) -> list:
        return self._chat().template(messages, generation_prompt)

    @property
    def stop_ids(self) -> frozenset:
        return self._chat().stop_ids


def workload_section() -> WorkloadChoice:
    """The workload picker; stops the page (st.stop) while there is nothing to replay yet."""
    bundled = {name: t for name, t in li.MOONCAKE_TRACES.items() if t.path.exists()}
    sources = SOURCES if bundled else SOURCES[:2]
    source = st.radio("Workload", sources, horizontal=True, key="cap_source")
    default_caps, default_ps, source_key = None, 1, source
    if source == "Preset workload":
        name = st.selectbox("Generator", list(GENERATORS), key="cap_preset",
                            format_func=lambda n: f"{n}: {(GENERATORS[n].__doc__ or '').strip().splitlines()[0].replace('`', '')}")
        source_key = name
        params = {}
        with st.expander("Workload parameters", expanded=False):
            cols = st.columns(4)
            for i, (k, v) in enumerate(li.preset_params(name).items()):
                col, key, hlp = cols[i % 4], f"cap_p_{name}_{k}", li.PARAM_HELP.get(k)
                if (name, k) in li.CHOICES:
                    params[k] = col.selectbox(k, li.CHOICES[name, k], index=li.CHOICES[name, k].index(v), key=key, help=hlp)
                elif k == "request_rate":
                    params[k] = col.number_input(k, min_value=0.0, value=float(v or 0.0), step=1.0, key=key, help=hlp)
                else:
                    params[k] = int(col.number_input(k, min_value=0 if k == "seed" else 1, value=int(v), step=1, key=key,
                                                     help=hlp))
        try:
            workload = li.preset_workload(name, params)
        except ValueError as exc:
            st.error(f"These workload parameters do not work: {exc}")
            st.stop()
        default_caps = li.PRESET_CAPACITIES.get(name)
    elif source == "Upload a trace":
        up = st.file_uploader("Trace (JSONL or JSON)", type=["jsonl", "json", "txt", "gz"], key="cap_upload",
                              help="Mooncake lines {timestamp, input_length, output_length, hash_ids}, or one request a "
                                   "line (or a JSON array of them): [token ids], {\"input_ids\": [...], \"output_len\": "
                                   "8}, {\"text\": \"...\"}, or chats: OpenAI {\"messages\": [...]} (Batch API lines "
                                   "too), ShareGPT {\"conversations\": [...]}. Texts and chats are tokenized with the "
                                   "engine's tokenizer and chat template, which loads the model once; a conversation "
                                   "is one request per answer.")
        skip = st.checkbox("Skip malformed lines (count them instead of stopping at the first)", key="cap_skip")
        if up is None:
            st.info("Upload a Mooncake JSONL trace, a JSONL of token-id lists or a chat log (OpenAI messages, "
                    "ShareGPT) to replay it. No file yet: pick “Preset workload” to try the lab at once.")
            st.stop()
        data = up.getvalue()
        sessions = int(st.session_state.get("cap_sessions", DEFAULT_SESSIONS))
        digest = (hashlib.sha1(data).hexdigest(), skip, sessions)
        cached = st.session_state.get("cap_upload_parsed")
        if cached is not None and cached[0] == digest:
            workload = cached[1]
        else:
            try:
                workload = li.read_uploaded_trace(data, up.name, _tokenize, skip, _EngineChat(), sessions)
            except ValueError as exc:
                st.error(f"Cannot use this trace: {exc}")
                st.stop()
            st.session_state.cap_upload_parsed = (digest, workload)
        if workload.skipped_lines:
            st.warning(f"{workload.skipped_lines:,} malformed line(s) skipped.")
        for note in order_notes(workload):
            st.info(f"{note}.")
        if workload.params.get("conversations"):
            st.number_input("Conversations in progress at once", min_value=1, value=DEFAULT_SESSIONS, step=1,
                            key="cap_sessions",
                            help=f"{workload.params['conversations']:,} conversations of several turns: their turns "
                                 f"replay this many conversations at a time, in turn (1 runs each to its end). The "
                                 f"more at once, the longer an answer waits in the pool for its next turn.")
        source_key = f"upload_{digest[0][:12]}"
        default_ps = MOONCAKE_BLOCK if workload.is_block_trace else 1
    else:
        name = st.selectbox("Trace", list(bundled), key="cap_bundled")
        trace = bundled[name]
        path = trace.path.resolve()
        workload = _mooncake(str(path), path.stat().st_mtime)
        default_caps, default_ps, source_key = trace.capacities, MOONCAKE_BLOCK, f"mooncake_{name}"
        st.caption(trace.caption)

    longest = max(r.prompt_len for r in workload.requests)
    st.caption(f"**{workload.name}**: {plural(len(workload), 'request')}, "
               f"{plural(workload.prompt_tokens, 'prompt token')} "
               f"(longest {longest:,}), {'with' if workload.has_timestamps else 'no'} timestamps"
               + (f"; {workload.params['conversations']:,} conversations of several turns, "
                  f"{workload.params['sessions']} in progress at once." if workload.params.get("conversations") else "."))
    return WorkloadChoice(workload, default_caps, default_ps, source_key)
