"""Capacity lab, sections 2 and 3: the sweep's settings (capacities, policies, page size, model bytes,
overlap), running it, and its results (the hit-rate chart next to the two bounds, the tables)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import streamlit as st

from core.cache.eviction.registry import DESCRIPTIONS, POLICIES
from core.lab.page_trace import Overlap
from core.lab.sweep import SweepResult, rounding_note, run_sweep
from core.lab.units import ModelKV, add_bytes_columns, fmt_capacity
from radixui.figures.lab_chart import sweep_figure
from radixui.panels import lab_inputs as li
from radixui.panels.lab_kept import kept_section
from radixui.panels.lab_progress import SweepProgress
from radixui.panels.lab_workload import WorkloadChoice

PCT = st.column_config.NumberColumn(format="percent")
INT = st.column_config.NumberColumn(format="localized")


@dataclass
class SweepSettings:
    signature: tuple                # what the widgets say now: a stored result with another one is stale
    kv: Optional[ModelKV]
    workers: int


def sweep_section(choice: WorkloadChoice) -> SweepSettings:
    """The sweep's widgets and its Run button (the result goes to st.session_state.cap_result)."""
    workload, default_caps, default_ps, source_key = (choice.workload, choice.default_caps, choice.default_ps,
                                                      choice.source_key)
    c1, c2 = st.columns(2)
    c3, c4, c5, c6 = st.columns(4)
    c7, c8, _ = st.columns([2, 1, 1])
    model_name = c7.selectbox("Model (sizes the KV cache in bytes)", li.MODEL_CHOICES, key="cap_model",
                              help="with a model, capacities may be given in GiB or GB and every table shows GiB; "
                                   "bytes per token from its published config.json (MLA models by their latent)")
    kv_dtype = c8.selectbox("KV dtype", li.KV_DTYPES, key="cap_kv_dtype", disabled=model_name == li.TOKENS_ONLY)
    kv = li.model_choice(model_name, kv_dtype)
    if kv is not None:
        c7.caption(kv.describe())
    page_size = int(c3.number_input("Page size (tokens)", min_value=1, value=default_ps, step=1,
                                    key=f"cap_ps_{source_key}",
                                    help="the cache shares whole pages only; 512 makes block traces fast"))
    caps_text = c1.text_input("Pool capacities", value=default_caps or li.suggest_capacities(workload, page_size),
                              key=f"cap_caps_{source_key}",
                              help="comma-separated: tokens (4096; 4k = 4,000 tokens, 3M = 3,000,000 tokens), pages "
                                   "(6000p), or with a model bytes of KV memory (20GiB, 40GB)")
    policies = c2.multiselect("Eviction policies", list(POLICIES), default=li.DEFAULT_POLICIES, key="cap_policies",
                              help="; ".join(f"**{p}**: {d}" for p, d in DESCRIPTIONS.items()))
    big = workload.prompt_tokens > 1_000_000
    workers = int(c4.number_input("Processes", min_value=1, max_value=16, value=2 if big else 1, step=1,
                                  key=f"cap_workers_{source_key}",
                                  help="replay points in parallel processes (worth it for large traces)"))
    c5.markdown("&nbsp;")
    overlap_on = c5.toggle("Overlap in time", key=f"cap_overlap_{source_key}",
                           disabled=not workload.has_timestamps,
                           help="running requests hold their cached prefix and their slots until they finish, "
                                "as in a real server" + ("" if workload.has_timestamps else
                                                         ". Needs timestamps: give the preset a request_rate > 0"))
    ms_out = c6.number_input("ms per output token", min_value=0.0, value=20.0, step=5.0, key="cap_ms_out",
                             disabled=not overlap_on, help="with overlap: a request runs this long per output token")
    run = st.button("Run the sweep", type="primary", key="cap_run")

    signature = (source_key, json.dumps(workload.summary(), default=str), caps_text, tuple(policies), page_size,
                 overlap_on, ms_out, model_name, kv_dtype)
    overlap = Overlap(ms_per_output_token=ms_out) if overlap_on else None
    if run:
        try:
            caps, pols = li.parse_sweep_inputs(caps_text, policies, page_size, kv)
            line = SweepProgress(len(caps) * (len(pols) + 1), li.fmt_tokens)   # + 1: the optimum at each capacity
            bar = st.progress(*line.start())

            def point(task: dict, fraction: float) -> None:
                shown = line.point(task, fraction)
                if shown is not None:
                    bar.progress(*shown)

            result = run_sweep(workload, caps, pols, page_size, overlap, workers=workers,
                               progress=lambda d, t, row: bar.progress(*line.done(d, t, row)), point_progress=point)
            bar.empty()
            st.session_state.cap_result = (signature, result)
            st.session_state.cap_rounding = rounding_note(caps_text, page_size, kv)
            st.session_state.pop("cap_model_report", None)
        except ValueError as exc:
            st.error(f"Cannot run this sweep: {exc}")
    return SweepSettings(signature, kv, workers)


def results_section(settings: SweepSettings) -> SweepResult:
    """The stored sweep's results; stops the page until a sweep has run, and after them while the settings
    differ from the sweep's (stale)."""
    signature, kv = settings.signature, settings.kv
    stored = st.session_state.get("cap_result")
    if stored is None:
        st.info("Set the capacities and policies, then press **Run the sweep**.")
        st.stop()
    sig, res = stored
    if sig != signature:
        st.warning("The settings changed since this sweep; press **Run the sweep** to update the results below. "
                   "The planner (smallest pool, host tier, routing, the model run) waits for that sweep: on the "
                   "new workload with the old sweep's page size and capacities it gave wrong figures, and a "
                   "large trace replayed for minutes.")
    inf = res.infinite_hit_rate
    m = st.columns(4)
    m[0].metric("Infinite-capacity hit rate", f"{inf:.1%}", help="every prompt token that was ever seen before is a hit")
    m[1].metric("Distinct pages", f"{res.distinct_pages:,}", help=f"pages of {res.page_size} tokens the workload touches")
    m[2].metric("Points replayed", f"{len(res.points) + len(res.optimal):,}")
    m[3].metric("Sweep time", f"{res.seconds:.1f} s")
    if st.session_state.get("cap_rounding") and sig == signature:
        st.info(f"Note: {st.session_state.cap_rounding}.")
    if res.capped_note():
        st.info(f"Note: {res.capped_note()}.")
    if res.nothing_fits_note():
        st.warning(f"Note: {res.nothing_fits_note()}.")
    st.plotly_chart(sweep_figure(res, kv), width="stretch", key="cap_chart")
    kept_section(res, kv)

    st.markdown(f"**Smallest swept capacity reaching 90 % of the infinite-capacity hit rate** ({0.9 * inf:.1%}); "
                "the search below finds it between the swept points")
    reach = [{"policy": p, "capacity": "not at the swept capacities" if c is None else fmt_capacity(c, res.page_size, kv),
              "capacity_tokens": c, "capacity_pages": None if c is None else c // res.page_size,
              **({"capacity_gib": None if c is None else kv.gib(c)} if kv else {}),
              "reached": "yes" if c is not None else "no: not at the swept capacities"}
             for p, c in res.capacity_to_reach(0.9).items()]
    st.dataframe(reach, hide_index=True, key="cap_reach",
                 column_config={"capacity_tokens": INT, "capacity_pages": INT,
                                "capacity_gib": st.column_config.NumberColumn(format="%.3f GiB")})

    table = add_bytes_columns(res.table(), kv)
    st.markdown("**Every point** (the optimum's rows are the offline bound at each capacity)")
    st.dataframe(table, hide_index=True, width="stretch", key="cap_table",
                 column_config={**{c: INT for c in ("capacity_tokens", "capacity_pages", "hit_tokens", "tokens_saved",
                                                    "prompt_tokens", "evicted_tokens", "capacity_bytes")},
                                "capacity_gib": st.column_config.NumberColumn(format="%.3f GiB"),
                                "hit_rate": PCT, "optimal_hit_rate": PCT, "gap_to_optimal": PCT,
                                "fraction_of_infinite": PCT, "seconds": st.column_config.NumberColumn(format="%.2f")})
    d1, d2, _ = st.columns([1, 1, 4])
    d1.download_button("Download CSV", table.to_csv(index=False), "capacity_lab.csv", "text/csv", key="cap_csv")
    d2.download_button("Download JSON", json.dumps(res.to_json(), indent=2, default=lambda o: o.item()), "capacity_lab.json",
                       "application/json", key="cap_json")
    if sig != signature:
        st.stop()
    return res
