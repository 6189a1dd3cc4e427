"""Capacity lab: replay a workload through the real RadixCache at many pool sizes and eviction
policies (no model), next to the infinite-capacity rate and the offline optimum; optionally check
the prediction on the real model."""
import hashlib
import json

import streamlit as st

from core.eviction import DESCRIPTIONS, POLICIES
from core.lab.sweep import run_sweep
from core.lab.traces import load_mooncake
from core.lab.pages import Overlap
from core.lab.units import add_bytes_columns, fmt_capacity
from core.lab.workloads import GENERATORS
from radixui import lab_inputs as li
from radixui.lab_planner import host_section, size_section
from radixui.lab_routing import routing_section
from radixui.lab_plot import hit_rate_figure
from radixui.state import DEFAULT_MODEL, get_holder, get_runner

SOURCES = ["Preset workload", "Upload a trace", "Bundled Mooncake trace"]
PCT = st.column_config.NumberColumn(format="percent")
INT = st.column_config.NumberColumn(format="localized")

st.title("Capacity lab")
st.caption("How much prefix-cache hit rate does each slot of KV pool buy, and which eviction policy should you use? "
           "The lab replays a workload through the same RadixCache the engine uses, without running the model, "
           "at every pool size and policy you pick, and draws the two bounds no policy can beat: an infinite pool "
           "and the offline optimum (Belady).")


@st.cache_resource(show_spinner="Reading the Mooncake trace...")
def _mooncake(path: str, mtime: float):
    return load_mooncake(path)


def _model_name() -> str:
    holder = get_holder()
    return holder.config.model if holder.config else DEFAULT_MODEL


def _tokenize(text: str) -> list:
    """Text lines of an uploaded trace: the engine's tokenizer (loads the model once, on first use)."""
    return get_runner(_model_name()).tokenizer.encode(text, add_special_tokens=False)


# ----- 1. the workload --------------------------------------------------------------------------
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
    up = st.file_uploader("Trace (JSONL)", type=["jsonl", "json", "txt"], key="cap_upload",
                          help="Mooncake lines {timestamp, input_length, output_length, hash_ids}, or one request a "
                               "line: [token ids], {\"input_ids\": [...], \"output_len\": 8} or {\"text\": \"...\"} "
                               "(texts are tokenized with the engine's tokenizer, which loads the model once).")
    skip = st.checkbox("Skip malformed lines (count them instead of stopping at the first)", key="cap_skip")
    if up is None:
        st.info("Upload a Mooncake JSONL trace or a JSONL of token-id lists to replay it. No file yet: pick "
                "“Preset workload” to try the lab at once.")
        st.stop()
    data = up.getvalue()
    digest = (hashlib.sha1(data).hexdigest(), skip)
    cached = st.session_state.get("cap_upload_parsed")
    if cached is not None and cached[0] == digest:
        workload = cached[1]
    else:
        try:
            workload = li.read_uploaded_trace(data, up.name, _tokenize, skip)
        except ValueError as exc:
            st.error(f"Cannot use this trace: {exc}")
            st.stop()
        st.session_state.cap_upload_parsed = (digest, workload)
    if workload.skipped_lines:
        st.warning(f"{workload.skipped_lines:,} malformed line(s) skipped.")
    source_key = f"upload_{digest[0][:12]}"
    default_ps = li.MOONCAKE_PAGE_SIZE if workload.is_block_trace else 1
else:
    name = st.selectbox("Trace", list(bundled), key="cap_bundled")
    trace = bundled[name]
    path = trace.path.resolve()
    workload = _mooncake(str(path), path.stat().st_mtime)
    default_caps, default_ps, source_key = trace.capacities, li.MOONCAKE_PAGE_SIZE, f"mooncake_{name}"
    st.caption(trace.caption)

longest = max(r.prompt_len for r in workload.requests)
st.caption(f"**{workload.name}**: {len(workload):,} requests, {workload.prompt_tokens:,} prompt tokens "
           f"(longest {longest:,}), {'with' if workload.has_timestamps else 'no'} timestamps.")

# ----- 2. the sweep -----------------------------------------------------------------------------
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
        bar = st.progress(0.0, text="Replaying...")

        def progress(done: int, total: int, row: dict) -> None:
            bar.progress(done / total, text=f"{done}/{total} points · {row['policy']} at "
                                            f"{li.fmt_tokens(row['capacity_tokens'])} tokens: {row['hit_rate']:.1%}")

        result = run_sweep(workload, caps, pols, page_size, overlap, workers=workers, progress=progress)
        bar.empty()
        st.session_state.cap_result = (signature, result)
        st.session_state.pop("cap_model_report", None)
    except ValueError as exc:
        st.error(f"Cannot run this sweep: {exc}")

# ----- 3. the results ---------------------------------------------------------------------------
stored = st.session_state.get("cap_result")
if stored is None:
    st.info("Set the capacities and policies, then press **Run the sweep**.")
    st.stop()
sig, res = stored
if sig != signature:
    st.warning("The settings changed since this sweep; press **Run the sweep** to update the results below.")
inf = res.infinite_hit_rate
m = st.columns(4)
m[0].metric("Infinite-capacity hit rate", f"{inf:.1%}", help="every prompt token that was ever seen before is a hit")
m[1].metric("Distinct pages", f"{res.distinct_pages:,}", help=f"pages of {res.page_size} tokens the workload touches")
m[2].metric("Points replayed", f"{len(res.points) + len(res.optimal):,}")
m[3].metric("Sweep time", f"{res.seconds:.1f} s")
if res.capped_note():
    st.info(f"Note: {res.capped_note()}.")
st.plotly_chart(hit_rate_figure(res, kv=kv), width="stretch", key="cap_chart")

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

# ----- 4. the planner: smallest pool by search, and a host tier ---------------------------------
st.divider()
res_overlap = Overlap(**res.overlap) if res.overlap else None     # as the sweep ran, not as the widgets say now
size_section(workload, res.policies, res.page_size, res_overlap, kv, workers, signature)
st.divider()
host_section(workload, res, res_overlap, kv, signature)
routing_section(workload, res.capacities, res.policies, res.page_size, res_overlap,
                lambda c: fmt_capacity(c, res.page_size, kv), signature)

# ----- 5. through the real model (off the main path: it loads the model) ------------------------
st.divider()
st.subheader("Through the real model")
st.caption("Runs the workload's prompts (token ids folded into the model's vocabulary) through the engine twice, "
           "with the radix cache on and off, one request at a time, in the same pool. Reports the prefill time "
           "actually saved, the measured hit rate against the replay's prediction, and checks that the greedy "
           "outputs are identical. The first run loads the model (about 20 s); on a CPU the default preset takes "
           "one to two minutes.")
from radixui import lab_model_run as lm  # noqa: E402  (imports the engine; only this section needs it)

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
        runner = get_runner(_model_name())
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
