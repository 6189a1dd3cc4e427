"""The sweep's chart: hit rate against capacity, one line per policy, the two bounds dashed.

Policies that hit equally (lfu and slru often do) would hide one another, so each policy has its own
marker, dash and slight marker size: a line drawn on top of another still shows its markers. With a
model (core.lab.units.ModelKV) the capacity ticks read tokens and GiB.

A figure builder only (no Streamlit): the Capacity lab page passes it to st.plotly_chart, the CLI
(`python -m core.lab sweep --out DIR`) imports it lazily to write chart.html. It lives here, not in
core/lab/, because core never imports plotly.
"""
from __future__ import annotations

from typing import Optional

from core.lab.sweep import OPTIMAL, SweepResult
from core.lab.units import ModelKV

_COLORS = {"lru": "#1f77b4", "lfu": "#d62728", "fifo": "#2ca02c", "mru": "#9467bd", "filo": "#8c564b",
           "priority": "#e377c2", "slru": "#ff7f0e", "gdsf": "#17becf", "arc": "#bcbd22", "s3fifo": "#7f7f7f",
           "lecar": "#393b79", "lhd": "#ad494a", "recall": "#637939", "recall-value": "#e7969c",
           "lrb": "#8c6d31", "lrb-arc": "#7b4173", OPTIMAL: "#111111"}
# (marker symbol, line dash, marker size): no two policies alike, larger markers drawn first
_STYLES = {"lru": ("circle", "solid", 11), "lfu": ("square-open", "dashdot", 13), "fifo": ("diamond", "longdashdot", 9),
           "mru": ("triangle-up", "dot", 10), "filo": ("triangle-down", "4px,3px,1px,3px", 10),
           "priority": ("cross", "longdash", 9), "slru": ("x", "dash", 8),
           "gdsf": ("star", "2px,2px", 10), "arc": ("hexagon", "8px,2px", 10), "s3fifo": ("pentagon", "1px,4px", 9),
           "lecar": ("star-triangle-up", "6px,2px,2px,2px", 10), "lhd": ("hourglass", "3px,6px", 9),
           "recall": ("diamond-wide", "5px,2px,1px,2px", 9), "recall-value": ("bowtie", "1px,2px,6px,2px", 9),
           "lrb": ("octagon", "5px,3px,1px,3px,1px,3px", 10), "lrb-arc": ("triangle-left", "10px,4px", 10)}


def policy_style(policy: str) -> dict:
    """Line and marker of a policy's trace (distinct for every policy in core.cache.eviction.registry.POLICIES)."""
    symbol, dash, size = _STYLES.get(policy, ("circle", "solid", 9))
    return {"line": dict(color=_COLORS.get(policy), dash=dash, width=2),
            "marker": dict(symbol=symbol, size=size, line=dict(width=1.5, color=_COLORS.get(policy)))}


def hit_rate_figure(result: SweepResult, log_x: Optional[bool] = None, title: Optional[str] = None,
                    kv: Optional[ModelKV] = None):
    """plotly Figure: x = capacity (tokens, and GiB with `kv`), y = prompt-token hit rate."""
    import plotly.graph_objects as go

    fig = go.Figure()
    caps = result.capacities
    if log_x is None:
        log_x = len(caps) > 2 and caps[-1] / caps[0] >= 20
    ps = result.page_size
    gib = "" if kv is None else " = %{customdata[2]:.2f} GiB"
    hover = ("%{fullData.name}<br>capacity %{x:,} tokens (%{customdata[0]:,} pages of " + str(ps) + ")" + gib +
             "<br>hit rate %{y:.1%}<br>gap to optimum %{customdata[1]:.1%}<extra></extra>")
    g = (lambda c: 0.0 if kv is None else kv.gib(c))
    opt = {b.capacity_tokens: b.hit_rate for b in result.optimal}
    for policy in result.policies:
        pts = [p for p in result.points if p.policy == policy]
        fig.add_trace(go.Scatter(
            x=[p.capacity_tokens for p in pts], y=[p.hit_rate for p in pts], name=policy, mode="lines+markers",
            **policy_style(policy),
            customdata=[[p.capacity_pages, opt.get(p.capacity_tokens, float("nan")) - p.hit_rate,
                         g(p.capacity_tokens)] for p in pts],
            hovertemplate=hover))
    if result.optimal:
        fig.add_trace(go.Scatter(
            x=[b.capacity_tokens for b in result.optimal], y=[b.hit_rate for b in result.optimal],
            name="optimal (Belady)", mode="lines+markers", line=dict(color=_COLORS[OPTIMAL], dash="dash"),
            marker=dict(symbol="star", size=9),
            customdata=[[b.capacity_pages, 0.0, g(b.capacity_tokens)] for b in result.optimal], hovertemplate=hover))
    inf = result.infinite_hit_rate
    fig.add_trace(go.Scatter(
        x=[caps[0], caps[-1]], y=[inf, inf], name=f"infinite capacity ({inf:.1%})", mode="lines",
        line=dict(color="#7f7f7f", dash="dot"), hovertemplate="infinite capacity %{y:.1%}<extra></extra>"))
    xtitle = "pool capacity (tokens)" if kv is None else f"pool capacity (tokens / GiB of {kv.name} KV)"
    xaxis = dict(title=xtitle, type="log" if log_x else "linear")
    if len(caps) <= 12:   # tick exactly the swept capacities, in short form (512k, 3.07M), with GiB under
        xaxis.update(tickvals=caps, ticktext=[t + ("" if kv is None else f"<br>{kv.gib(c):.3g} GiB")
                                              for c, t in zip(caps, short_labels(caps))])
    name = result.workload.get("name", "workload")
    fig.update_layout(
        title=title or f"Prefix-cache hit rate vs pool size: {name}, page size {ps} token{'s' if ps > 1 else ''}",
        xaxis=xaxis,
        yaxis=dict(title="hit rate (hit prompt tokens / prompt tokens)", tickformat=".0%", rangemode="tozero"),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0,
                    title=dict(text=f"policy (page size {ps}):", side="left")),
        hovermode="closest",
        margin=dict(l=60, r=20, t=legend_top(len(fig.data)), b=50))
    return fig


def legend_top(entries: int) -> int:
    """The top margin for a horizontal legend of `entries` above the plot and the title over it: a row holds
    about five entries of a 1,000-pixel chart (16 policies drew 3-4 rows over the title at the fixed 80 px)."""
    rows = max(1, -(-entries // 5))
    return 60 + 24 * rows


def _short(n: int, digits: int = 3) -> str:
    """512 -> '512', 3072 -> '3.07k', 3072000 -> '3.07M' (`digits` significant)."""
    for div, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1000, "k")):
        if n >= div:
            return f"{n / div:.{digits}g}{unit}"
    return str(n)


def short_labels(caps: list[int]) -> list[str]:
    """The ticks' short forms, with as many digits as it takes for distinct capacities to read apart (3,000,000
    and 3,000,003 both read '3M' at 3 digits); the full numbers where even 9 digits do not tell them apart."""
    for digits in range(3, 10):
        labels = [_short(c, digits) for c in caps]
        if len(set(labels)) == len(set(caps)):
            return labels
    return [f"{c:,}" for c in caps]
