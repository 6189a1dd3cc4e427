"""Capacity lab, section 5: the workload's prompts through the real model, cache on and off: the prefill
time actually saved, the measured hit rate against the replay's prediction, and identical greedy outputs."""
from __future__ import annotations

import streamlit as st

from core.lab import model_run as lm
from core.lab.sweep import SweepResult
from core.lab.workloads import Workload
from radixui.connect.resources import get_runner
from radixui.panels.lab_sweep import INT, PCT
from radixui.panels.lab_workload import model_name


def model_section(workload: Workload, res: SweepResult) -> None:
    longest = max(r.prompt_len for r in workload.requests)
    st.divider()
    st.subheader("Through the real model")
    st.caption("Runs the workload's prompts (token ids folded into the model's vocabulary) through the engine twice, "
               "with the radix cache on and off, one request at a time, in the same pool. Reports the prefill time "
               "actually saved, the measured hit rate against the replay's prediction, and checks that the greedy "
               "outputs are identical. The first run loads the model (about 20 s); on a CPU the default preset takes "
               "one to two minutes.")

    try:
        lm.check_model_run(workload)
    except ValueError as exc:
        st.info(f"Not available for this workload: {exc}.")
        st.stop()
    c1, c2, c3, c4 = st.columns([2, 2, 2, 2])
    fits = [i for i, c in enumerate(res.capacities) if c >= longest + 16]
    cap = c1.selectbox("Pool capacity", res.capacities, key="cap_m_cap", format_func=lambda c: f"{c:,} tokens",
                       index=max(len(res.capacities) // 2, fits[0] if fits else 0))
    pol = c2.selectbox("Eviction policy", res.policies, key="cap_m_pol")
    new_tokens = int(c3.number_input("New tokens per request", min_value=1, max_value=lm.MAX_NEW_TOKENS, value=4,
                                     key="cap_m_new"))
    c4.markdown("&nbsp;")
    go = c4.button("Run through the real model", key="cap_m_run", width="stretch")
    if go:
        try:
            lm.check_model_run(workload, cap, res.page_size, new_tokens)
            runner = get_runner(model_name())
            bar = st.progress(0.0, text="Running the prompts...")
            report = lm.run_through_model(runner, workload, cap, pol, res.page_size, new_tokens,
                                          progress=lambda d, t, what: bar.progress(d / t, text=what))
            bar.empty()
            st.session_state.cap_model_report = report
        except ValueError as exc:
            st.error(f"The model run could not start: {exc}")
    report = st.session_state.get("cap_model_report")
    if report is not None:
        st.markdown(f"**{report.workload}** · {report.requests} requests · pool {report.pool_slots:,} slots "
                    f"(page {report.page_size}) · {report.policy} · {report.max_new_tokens} new tokens each")
        m = st.columns(4)
        m[0].metric("Prefill time saved", f"{report.prefill_saved:.2f} s", f"{report.prefill_saved_fraction:.0%} of cache off",
                    help="sum of the requests' times to first token, cache off minus cache on")
        m[1].metric("Total time saved", f"{report.total_saved:.2f} s", f"{report.total_saved_fraction:.0%} of cache off")
        diff = report.on.hit_rate - report.predicted.hit_rate
        m[2].metric("Measured hit rate", f"{report.on.hit_rate:.1%}",
                    "as the replay predicted" if abs(diff) < 5e-4 else f"{diff * 100:+.1f} points vs the replay",
                    delta_color="off", delta_arrow="off")
        m[3].metric("Replay's prediction", f"{report.predicted.hit_rate:.1%}",
                    help="the cache-only replay of exactly these prompts at this pool size. The engine always computes "
                         "a prompt's last token, so a fully cached prompt counts one token less there")
        if report.outputs_equal:
            st.success(f"Greedy outputs are identical with and without the cache ({report.requests} requests).")
        else:
            st.warning(f"Greedy outputs differ for {len(report.mismatches)} request(s): {report.mismatches[:10]}")
        st.dataframe(report.table(), hide_index=True, key="cap_m_table",
                     column_config={"hit_rate": PCT, "prefill_s": st.column_config.NumberColumn(format="%.2f"),
                                    "cached_tokens": INT, "prompt_tokens": INT, "evicted_tokens": INT,
                                    "total_s": st.column_config.NumberColumn(format="%.2f")})
