"""The Capacity lab page's planner sections (Streamlit): the smallest pool reaching a share of the
infinite-capacity rate (core.lab.size, found by search), and a host-memory tier behind the pool
(core.lab.host_tier: device hits, host hits, misses, and with a model the time to first token)."""
from __future__ import annotations

from typing import Optional

import pandas as pd
import streamlit as st

from core.lab.host_tier import DEFAULT_BANDWIDTH_GBPS, DEFAULT_PREFILL_TOKENS_PER_S, WRITE_POLICIES, replay_with_host
from core.lab.page_trace import Overlap
from core.lab.size import size
from core.lab.units import ModelKV, fmt_capacity
from core.lab.workloads import Workload
from radixui.panels import lab_inputs as li

PCT = st.column_config.NumberColumn(format="percent")
INT = st.column_config.NumberColumn(format="localized")
GIB = st.column_config.NumberColumn(format="%.3f GiB")
SEC = st.column_config.NumberColumn(format="%.4f s")


def size_section(workload: Workload, policies: list[str], page_size: int, overlap: Optional[Overlap],
                 kv: Optional[ModelKV], workers: int, signature) -> None:
    st.subheader("How small a pool reaches the goal?")
    st.caption("Searches capacity (doubling, then bisection, starting from the optimum's answer, which no policy "
               "can beat) for the smallest pool whose hit rate reaches the share you pick of the infinite-capacity "
               "rate: not read off the swept points. Bisection assumes a larger pool never hits less; every replay "
               "is checked for that and the table says when a policy broke it.")
    c1, c2, c3 = st.columns([2, 2, 2])
    target = c1.number_input("Share of the infinite-capacity hit rate", min_value=0.05, max_value=1.0, value=0.9,
                             step=0.05, key="cap_size_target")
    tol = c2.selectbox("Within", [0.01, 0.02, 0.05], format_func=lambda x: f"{x:.0%} of the answer",
                       key="cap_size_tol")
    c3.markdown("&nbsp;")
    if c3.button("Search the smallest pool", key="cap_size_run", width="stretch"):
        try:
            with st.spinner("Searching: a replay per probe..."):
                answers = size(workload, policies, float(target), page_size, overlap, float(tol), workers)
            st.session_state.cap_size = ((signature, target, tol), answers)
        except ValueError as exc:
            st.error(f"Cannot search: {exc}")
    stored = st.session_state.get("cap_size")
    if stored is None:
        return
    (sig, t, _), answers = stored
    if sig != signature:
        st.warning("The settings changed since this search; press **Search the smallest pool** to update it.")
    rows = []
    for a in answers:
        d = a.to_dict(kv)
        d["answer"] = "not reached: " + a.note if a.capacity_pages is None else fmt_capacity(a.capacity_tokens,
                                                                                              page_size, kv)
        d["monotone"] = "yes" if a.monotone else "NO: a larger pool hit less; a smaller one may also reach it"
        rows.append(d)
    cols = ["policy", "answer", "capacity_tokens", "capacity_pages"] + (["capacity_gib"] if kv else []) + [
        "hit_rate", "lower_tokens", "replays", "monotone"]
    st.markdown(f"**Smallest pool reaching {t:.0%} of the infinite-capacity hit rate**")
    st.dataframe(pd.DataFrame(rows)[cols], hide_index=True, key="cap_size_table", width="stretch",
                 column_config={"capacity_tokens": INT, "capacity_pages": INT, "lower_tokens": INT,
                                "capacity_gib": GIB, "hit_rate": PCT})


def host_section(workload: Workload, res, overlap: Optional[Overlap], kv: Optional[ModelKV], signature) -> None:
    st.subheader("A host-memory tier behind the pool")
    st.caption("As SGLang's HiCache: pages the pool evicts live on in host memory (write-through copies every new "
               "page, write-through-selective the ones used twice, write-back only on eviction); a request's "
               "pages found there are loaded back instead of recomputed. With a model, the time to first token "
               "per request (prefill of what is not hit, plus loading the host hits over the host link).")
    c1, c2, c3 = st.columns(3)
    c4, c5, _ = st.columns(3)
    device = c1.selectbox("Device pool", res.capacities, index=len(res.capacities) // 2, key="cap_host_dev",
                          format_func=lambda c: fmt_capacity(c, res.page_size, kv))
    host_text = c2.text_input("Host tier", value=str(4 * device), key="cap_host_cap",
                              help="tokens (64k), pages (600p), or GiB/GB with a model (200GiB)")
    wp = c3.selectbox("Write policy", list(WRITE_POLICIES), key="cap_host_wp",
                      help="SGLang's --hicache-write-policy")
    bw = c4.number_input("Host link, GB/s", min_value=0.1, value=DEFAULT_BANDWIDTH_GBPS, step=5.0, key="cap_host_bw",
                         disabled=kv is None, help="effective host-to-device bandwidth; PCIe 4.0 x16 is about 25")
    rate = c5.number_input("Prefill, tokens/s", min_value=1.0, value=float(DEFAULT_PREFILL_TOKENS_PER_S), step=1000.0,
                           key="cap_host_rate", disabled=kv is None,
                           help="prefill throughput of your model on your GPU (default: an 8B model on one "
                                "H100-class GPU, order of magnitude; measure yours)")
    if st.button("Replay with the host tier", key="cap_host_run"):
        try:
            host = li.parse_host_capacity(host_text, res.page_size, kv)
            rows = []
            for pol in res.policies:
                r = replay_with_host(workload, device, host, pol, res.page_size, overlap, wp)
                row = r.summary()
                if kv is not None:
                    row.update(r.ttft(kv, float(rate), float(bw)))
                rows.append(row)
            st.session_state.cap_host = ((signature, device, host_text, wp, bw, rate), rows)
        except ValueError as exc:
            st.error(f"Cannot replay with this host tier: {exc}")
    stored = st.session_state.get("cap_host")
    if stored is None:
        return
    (sig, *_), rows = stored
    if sig != signature:
        st.warning("The sweep changed since this replay; press **Replay with the host tier** to update it.")
    df = pd.DataFrame(rows)
    cols = ["policy", "device_tokens", "host_tokens", "write_policy", "device_hit_rate", "host_hit_rate", "hit_rate",
            "device_hit_tokens", "host_hit_tokens", "miss_tokens", "rejected"]
    if kv is not None:
        cols += ["prefill_seconds_saved", "ttft_p50_device_only", "ttft_p50_with_host", "ttft_p99_device_only",
                 "ttft_p99_with_host"]
    st.dataframe(df[cols], hide_index=True, key="cap_host_table", width="stretch",
                 column_config={**{c: INT for c in ("device_tokens", "host_tokens", "device_hit_tokens",
                                                    "host_hit_tokens", "miss_tokens")},
                                **{c: PCT for c in ("device_hit_rate", "host_hit_rate", "hit_rate")},
                                **{c: SEC for c in cols if c.startswith(("ttft", "prefill_seconds"))}})
