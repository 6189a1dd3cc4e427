"""The Capacity lab's sweep chart, with coinciding policies kept visible.

core.lab.chart draws one line per policy. Where two policies hit (nearly) as much, as LRU and FIFO
do on the Mooncake conversation trace (within 0.05 points at every capacity), the later trace's
marker covers the earlier one and a policy seems missing. Here every point within `TOL` of an
earlier-drawn policy's point is drawn open, over a larger marker of the earlier one, and policies
that coincide at every capacity say so in the legend ("fifo (≈ lru here)") and in a note under
the plot.
"""
from __future__ import annotations

from typing import Optional

import plotly.graph_objects as go

from core.lab.chart import hit_rate_figure
from core.lab.sweep import SweepResult
from core.lab.units import ModelKV

TOL = 0.005       # hit rates closer than half a point draw on top of each other (a marker is ~10 px of ~400)
GROW = 6          # how much larger (px) an earlier marker is drawn where a later policy covers it


def open_symbol(symbol: str) -> str:
    """plotly's hollow variant of a marker symbol ("diamond" -> "diamond-open")."""
    return symbol if symbol.endswith("-open") else f"{symbol}-open"


def rates_by_policy(result: SweepResult) -> dict[str, dict[int, float]]:
    """policy -> capacity -> hit rate."""
    out: dict[str, dict[int, float]] = {p: {} for p in result.policies}
    for pt in result.points:
        out[pt.policy][pt.capacity_tokens] = pt.hit_rate
    return out


def _close(a: Optional[float], b: Optional[float]) -> bool:
    return a is not None and b is not None and abs(a - b) <= TOL


def coinciding_groups(result: SweepResult) -> list[list[str]]:
    """Policies within TOL of the group's first at every swept capacity, in drawing order; groups of 2+."""
    rates = rates_by_policy(result)
    groups: list[list[str]] = []
    for p in result.policies:
        for g in groups:
            if rates[p] and rates[p].keys() == rates[g[0]].keys() and \
                    all(_close(rates[p][c], rates[g[0]][c]) for c in rates[p]):
                g.append(p)
                break
        else:
            groups.append([p])
    return [g for g in groups if len(g) > 1]


def sweep_figure(result: SweepResult, kv: Optional[ModelKV] = None) -> go.Figure:
    """core.lab.chart's figure, restyled so no policy's marker is hidden under another's."""
    fig = hit_rate_figure(result, kv=kv)
    rates = rates_by_policy(result)
    traces = {t.name: t for t in fig.data if t.name in rates}
    pols = [p for p in result.policies if p in traces]
    for i, p in enumerate(pols):
        t = traces[p]
        caps = list(t.x)
        symbol, size = t.marker.symbol, t.marker.size
        symbols = [open_symbol(symbol) if any(_close(rates[q].get(c), rates[p][c]) for q in pols[:i]) else symbol
                   for c in caps]
        sizes = [size + GROW if any(_close(rates[q].get(c), rates[p][c]) for q in pols[i + 1:]) else size
                 for c in caps]
        t.marker.symbol, t.marker.size, t.marker.line.width = symbols, sizes, 2
    notes = []
    for g in coinciding_groups(result):
        exact = all(rates[q] == rates[g[0]] for q in g)
        sign = "=" if exact else "≈"
        traces[g[0]].name = f"{g[0]} ({sign} {', '.join(g[1:])} here)"
        for q in g[1:]:
            traces[q].name = f"{q} ({sign} {g[0]} here)"
        notes.append(f" {sign} ".join(g) + " here: " + ("the same hit rate at every capacity" if exact else
                                                           f"within {TOL * 100:g} percentage points at every capacity"))
    if notes:
        fig.add_annotation(xref="paper", yref="paper", x=0, y=0, yshift=-64, xanchor="left", yanchor="top",
                           showarrow=False, align="left", font=dict(size=12, color="#374151"),
                           text=";<br>".join(notes) + ".<br>The first one's marker is drawn larger, the others open "
                                                      "on top of it.")
        fig.update_layout(margin=dict(b=96 + 16 * len(notes)))   # one line a note: a joined line ran off the edge
    return fig
