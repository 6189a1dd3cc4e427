"""The sweep's chart: hit rate against capacity, one line per policy, the two bounds dashed.

A figure builder only (no Streamlit): the Capacity lab page passes it to st.plotly_chart, the CLI
(`python -m core.lab sweep --out DIR`) imports it lazily to write chart.html. It lives here, not in
core/lab/, because core never imports plotly.
"""
from __future__ import annotations

from typing import Optional

from core.lab.sweep import OPTIMAL, SweepResult

_COLORS = {"lru": "#1f77b4", "lfu": "#d62728", "fifo": "#2ca02c", "mru": "#9467bd", "filo": "#8c564b",
           "priority": "#e377c2", "slru": "#ff7f0e", OPTIMAL: "#111111"}


def hit_rate_figure(result: SweepResult, log_x: Optional[bool] = None, title: Optional[str] = None):
    """plotly Figure: x = capacity (tokens), y = prompt-token hit rate."""
    import plotly.graph_objects as go

    fig = go.Figure()
    caps = result.capacities
    if log_x is None:
        log_x = len(caps) > 2 and caps[-1] / caps[0] >= 20
    ps = result.page_size
    hover = ("%{fullData.name}<br>capacity %{x:,} tokens (%{customdata[0]:,} pages of " + str(ps) + ")"
             "<br>hit rate %{y:.1%}<br>gap to optimum %{customdata[1]:.1%}<extra></extra>")
    opt = {b.capacity_tokens: b.hit_rate for b in result.optimal}
    for policy in result.policies:
        pts = [p for p in result.points if p.policy == policy]
        fig.add_trace(go.Scatter(
            x=[p.capacity_tokens for p in pts], y=[p.hit_rate for p in pts], name=policy, mode="lines+markers",
            line=dict(color=_COLORS.get(policy)),
            customdata=[[p.capacity_pages, opt.get(p.capacity_tokens, float("nan")) - p.hit_rate] for p in pts],
            hovertemplate=hover))
    if result.optimal:
        fig.add_trace(go.Scatter(
            x=[b.capacity_tokens for b in result.optimal], y=[b.hit_rate for b in result.optimal],
            name="optimal (Belady)", mode="lines+markers", line=dict(color=_COLORS[OPTIMAL], dash="dash"),
            customdata=[[b.capacity_pages, 0.0] for b in result.optimal], hovertemplate=hover))
    inf = result.infinite_hit_rate
    fig.add_trace(go.Scatter(
        x=[caps[0], caps[-1]], y=[inf, inf], name=f"infinite capacity ({inf:.1%})", mode="lines",
        line=dict(color="#7f7f7f", dash="dot"), hovertemplate="infinite capacity %{y:.1%}<extra></extra>"))
    xaxis = dict(title="pool capacity (tokens)", type="log" if log_x else "linear")
    if len(caps) <= 12:   # tick exactly the swept capacities, in short form (512k, 3.07M)
        xaxis.update(tickvals=caps, ticktext=[_short(c) for c in caps])
    name = result.workload.get("name", "workload")
    fig.update_layout(
        title=title or f"Prefix-cache hit rate vs pool size: {name} (page {ps})",
        xaxis=xaxis,
        yaxis=dict(title="hit rate (hit prompt tokens / prompt tokens)", tickformat=".0%", rangemode="tozero"),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0), hovermode="closest",
        margin=dict(l=60, r=20, t=80, b=50))
    return fig


def _short(n: int) -> str:
    """512 -> '512', 3072 -> '3.07k', 3072000 -> '3.07M'."""
    for div, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1000, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)
