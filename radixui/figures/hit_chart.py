"""Hit rate over time, from the request table: cumulative and over the last `window` requests,
one point per admitted request (the engine's own KPIs use the same two definitions)."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from radixui.figures.plot import figure

WINDOW = 20
CUMULATIVE_COLOUR, RECENT_COLOUR = "#1f2937", "#2f7fd8"


def hit_rate_series(requests: Sequence, window: int = WINDOW) -> dict[str, list]:
    """x = request number in submit order (only requests already admitted: a waiting request has
    no cached-token count yet), cumulative and recent hit rate in percent of prompt tokens."""
    x, cum, recent, rids = [], [], [], []
    tot_c = tot_p = 0
    last: list[tuple[int, int]] = []
    for i, r in enumerate(requests, start=1):
        if r.state == "waiting" or not r.prompt_tokens:
            continue
        tot_c += r.cached_tokens
        tot_p += r.prompt_tokens
        last = (last + [(r.cached_tokens, r.prompt_tokens)])[-window:]
        x.append(i)
        rids.append(r.rid)
        cum.append(100.0 * tot_c / tot_p)
        recent.append(100.0 * sum(c for c, _ in last) / sum(p for _, p in last))
    return {"x": x, "cumulative": cum, "recent": recent, "rid": rids}


FEW = 12   # up to this many points the x axis is request numbers 1, 2, ... (at least 1-5), one tick each


def hit_rate_figure(requests: Sequence, window: int = WINDOW, height: int = 150) -> go.Figure:
    """The two hit-rate lines over request numbers. With few points (none included) the x axis shows
    whole request numbers from 1, never plotly's default -1..6 of an empty axis."""
    s = hit_rate_series(requests, window)
    few = len(s["x"]) <= FEW
    xaxis = dict(title=None, gridcolor="#f3f4f6", dtick=1 if few else None,
                 range=[0.5, max(5, s["x"][-1] if s["x"] else 0) + 0.5] if few else None)
    traces = [dict(type="scatter", x=s["x"], y=s["cumulative"], mode="lines+markers", name="cumulative",
                   line=dict(color=CUMULATIVE_COLOUR, width=2), marker=dict(size=5), customdata=s["rid"],
                   hovertemplate="request %{customdata}<br>cumulative %{y:.1f}%<extra></extra>"),
              dict(type="scatter", x=s["x"], y=s["recent"], mode="lines", name=f"last {window}",
                   line=dict(color=RECENT_COLOUR, width=2, dash="dash"), customdata=s["rid"],
                   hovertemplate=f"request %{{customdata}}<br>last {window}: %{{y:.1f}}%<extra></extra>")]
    layout = dict(height=height, margin=dict(l=40, r=8, t=28, b=28), paper_bgcolor="#ffffff", plot_bgcolor="#ffffff",
                  title=dict(text="Cache hit rate (% of prompt tokens)", x=0.01, font=dict(size=12)),
                  xaxis=xaxis,
                  yaxis=dict(range=[0, 100], gridcolor="#e5e7eb", ticksuffix="%"),
                  legend=dict(orientation="h", x=1, xanchor="right", y=1.12, yanchor="bottom", font=dict(size=10)))
    if not s["x"]:
        layout["annotations"] = [dict(xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                                      text="no request admitted yet", font=dict(color="#6b7280"))]
    return figure(traces, layout)
