"""The Capacity lab's replicas section: hit rate vs replicas x routing, next to one cache's optimum.

A planner asks "two replicas of 40 GiB or one of 80?": each point routes the workload over N
replicas of the chosen capacity with a model of sglang-router (core/lab/routing.py) and replays
every replica's share through the real RadixCache; the reference line is one cache holding all N
replicas' memory, and its offline optimum, the most any routing could get from that memory.
"""
from __future__ import annotations

from typing import Callable, Optional

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from core.lab.optimal import Bounds
from core.lab.page_trace import Overlap
from core.lab.replay import replay
from core.lab.routing import DESCRIPTIONS, ROUTING_POLICIES, RouterConfig, replay_routed, route
from core.lab.workloads import Workload
from radixui.figures.palette import ROUTING_COLOURS

DASHES = {"round_robin": "dot", "cache_aware": "solid", "prefix_hash": "dash", "least_load": "dashdot"}
SYMBOLS = {"round_robin": "circle", "cache_aware": "diamond", "prefix_hash": "triangle-up", "least_load": "square"}


def routing_rows(workload: Workload, capacity: int, counts: list[int], routings: list[str], policy: str,
                 page_size: int, overlap: Optional[Overlap], concurrency: Optional[int],
                 config: RouterConfig = RouterConfig(),
                 progress: Optional[Callable[[int, int, str], None]] = None) -> pd.DataFrame:
    """One row per (replicas, routing) plus the one-cache reference rows ("one cache", "optimum").
    `progress(done, total, what)` is called before each point with the point about to be computed."""
    bounds = Bounds(workload, page_size, overlap)
    rows = []
    total = len(counts) * (2 + len(routings))

    def step(what: str) -> None:
        if progress is not None:
            progress(len(rows), total, what)

    for n in counts:
        step(f"{n} replica{'s' if n != 1 else ''}: one cache of {n} x the memory")
        rows.append({"replicas": n, "routing": "one cache", "hit_rate": replay(workload, capacity * n, policy,
                                                                                page_size, overlap).hit_rate})
        step(f"{n} replica{'s' if n != 1 else ''}: the offline optimum")
        rows.append({"replicas": n, "routing": "optimum", "hit_rate": bounds.optimal(capacity * n).hit_rate})
        for r in routings:
            step(f"{n} replica{'s' if n != 1 else ''}: {r}")
            assign = route(workload, n, r, config, overlap, concurrency=concurrency)
            res = replay_routed(workload, capacity, n, r, policy, page_size, overlap, config, assign)
            d = res.to_dict()
            rows.append({"replicas": n, "routing": r, "hit_rate": res.hit_rate,
                         "requests per replica": " ".join(map(str, d["requests_per_replica"])),
                         "hit rate per replica": " ".join(f"{h:.1%}" for h in d["hit_rate_per_replica"]),
                         "load imbalance": d["load_imbalance"]})
    return pd.DataFrame(rows)


def routing_figure(df: pd.DataFrame, capacity_label: str) -> go.Figure:
    fig = go.Figure()
    for name, part in df.groupby("routing", sort=False):
        if name in ("one cache", "optimum"):
            style = dict(line=dict(color="#444" if name == "optimum" else "#999", dash="longdash"),
                         marker=dict(symbol="star" if name == "optimum" else "square"))
            label = ("offline optimum" if name == "optimum" else "one cache, same eviction") + " with N x the memory"
        else:
            colour = ROUTING_COLOURS.get(name, "#111827")
            style = dict(line=dict(dash=DASHES.get(name, "solid"), width=2.5, color=colour),
                         marker=dict(size=9, color=colour, symbol=SYMBOLS.get(name, "circle")))
            label = name
        fig.add_trace(go.Scatter(x=part["replicas"], y=part["hit_rate"], mode="lines+markers", name=label,
                                 hovertemplate="%{x} replicas: %{y:.1%}<extra>" + label + "</extra>", **style))
    fig.update_layout(title=f"Hit rate vs replicas of {capacity_label} each", xaxis_title="replicas",
                      yaxis=dict(title="prompt tokens served from cache", tickformat=".0%", rangemode="tozero"),
                      xaxis=dict(dtick=1), height=380, margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def routing_section(workload: Workload, capacities: list[int], policies: list[str], page_size: int,
                    overlap: Optional[Overlap], fmt_capacity, signature) -> None:
    """Rendered under the sweep: pick a per-replica capacity, replica counts and routings."""
    # a keyed expander keeps its open state: the rerun of "Route and replay" must not fold the result away
    with st.expander("Replicas and routing: N caches behind sglang-router", key="rt_open"):
        st.caption("Each replica has its own radix cache; a router decides where each request goes without seeing "
                   "the caches. The routings are models of sglang-router's policies (`cache_aware` follows the "
                   "router's approximate prefix tree; a miss goes to the least loaded replica). "
                   + " ".join(f"**{k}**: {v}." for k, v in DESCRIPTIONS.items()))
        c1, c2, c3, c4 = st.columns(4)
        cap = c1.selectbox("Capacity per replica", capacities, index=len(capacities) // 2,
                           format_func=fmt_capacity, key="rt_cap")
        counts = c2.multiselect("Replicas", [1, 2, 3, 4, 6, 8], default=[1, 2, 4], key="rt_counts")
        routings = c3.multiselect("Routing", list(ROUTING_POLICIES), default=["round_robin", "cache_aware"],
                                  key="rt_routings")
        policy = c4.selectbox("Eviction in each replica", policies, key="rt_policy")
        conc = st.number_input("Client concurrency (requests in flight; 0 = one at a time or the timestamps)",
                               min_value=0, max_value=512, value=0, key="rt_conc")
        if not counts or not routings:
            st.info("Pick at least one replica count and one routing.")
            return
        key = (signature, cap, tuple(sorted(counts)), tuple(routings), policy, int(conc))
        if st.button("Route and replay", key="rt_go") or st.session_state.get("rt_key") == key:
            if st.session_state.get("rt_key") != key:
                bar = st.progress(0.0, text="Routing and replaying every replica...")

                def progress(done: int, total: int, what: str) -> None:
                    bar.progress(done / total, text=f"{done}/{total} points done · computing {what}")

                st.session_state.rt_df = routing_rows(workload, cap, sorted(counts), routings, policy, page_size,
                                                      None if conc else overlap, int(conc) or None, progress=progress)
                bar.empty()
                st.session_state.rt_key = key
            df = st.session_state.rt_df
            st.plotly_chart(routing_figure(df, fmt_capacity(cap)), width="stretch", key="rt_chart")
            st.dataframe(df, hide_index=True, width="stretch",
                         column_config={"hit_rate": st.column_config.NumberColumn("hit rate", format="percent")})
            st.download_button("Download CSV", df.to_csv(index=False), "capacity_lab_routing.csv", "text/csv",
                               key="rt_csv", help="keep this result: the rows above, to compare with the next run")
