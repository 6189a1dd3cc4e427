"""The tree as boxes sized by tokens (a treemap or an icicle): where the cache's memory goes.

Dark text on pale fills (every fill keeps a contrast ratio of at least 4.5 with the text), each box
labelled with its text and its subtree's token count; a box's own tokens are the part of it its
children do not cover.
"""
from __future__ import annotations

from typing import Optional

import plotly.graph_objects as go

from core.observe.snapshot import CacheSnapshot
from radixui.figures.fmt import TokenText, clean, fmt_time, html_escape, resolve_token_text, shorten, slot_runs
from radixui.figures.highlights import Highlights, node_state
from radixui.figures.palette import OVERVIEW_FILL, OVERVIEW_TEXT
from radixui.figures.plot import figure


def overview_fill(state: str, evictable: bool) -> str:
    if state == "cached" and evictable:
        return OVERVIEW_FILL["evictable"]
    return OVERVIEW_FILL.get(state, OVERVIEW_FILL["cached"])


def tree_overview(snapshot: CacheSnapshot, token_text: Optional[TokenText] = None,
                  highlights: Optional[Highlights] = None, kind: str = "treemap",
                  height: int = 460, label_chars: int = 28, max_depth: int = 6) -> go.Figure:
    """Every node as a box sized by the tokens in its subtree (plotly treemap or icicle), coloured
    like the tree (evictable leaves pale red); `max_depth` levels at once, click a box to go deeper.
    Box ids are the node ids as strings, so a click can set the tree's `focus`."""
    if kind not in ("icicle", "treemap"):
        raise ValueError(f"kind must be 'icicle' or 'treemap', got {kind!r}")
    tt = resolve_token_text(token_text)
    h = highlights or Highlights()
    nodes = snapshot.nodes
    tokens = {n.id: len(n.token_ids) for n in nodes}
    for n in reversed(nodes):
        if n.parent is not None:
            tokens[n.parent] += tokens[n.id]
    ids = [str(n.id) for n in nodes]
    parents = ["" if n.parent is None else str(n.parent) for n in nodes]
    labels, colours, hover, counts = [], [], [], []
    for n in nodes:
        state = node_state(n, h)
        if n.parent is None:
            labels.append(f"root · {tokens[n.id]:,} tokens cached")
        else:
            labels.append(f"#{n.id} " + (html_escape(shorten(clean(tt(n.token_ids)), label_chars)) or ""))
        counts.append(f"{tokens[n.id]:,} tok")
        colours.append(overview_fill(state, n.evictable))
        hover.append(f"node {n.id} · {len(n.token_ids)} tokens · subtree {tokens[n.id]:,} tokens<br>"
                     f"slots {html_escape(slot_runs(n.slots, max_runs=4))} · last_access_time "
                     f"{fmt_time(n.last_access_time)} · lock_ref {n.lock_ref}")
    trace = dict(type=kind, ids=ids, parents=parents, labels=labels, text=counts,
                 values=[max(tokens[n.id], 0) for n in nodes], branchvalues="total", hovertext=hover,
                 hoverinfo="text", textinfo="label+text",
                 marker=dict(colors=colours, line=dict(color="#6b7280", width=1)),
                 textfont=dict(size=13, color=OVERVIEW_TEXT), insidetextfont=dict(size=13, color=OVERVIEW_TEXT),
                 outsidetextfont=dict(size=13, color=OVERVIEW_TEXT), maxdepth=max_depth, name="overview")
    if kind == "icicle":
        trace["tiling"] = dict(orientation="h")
    else:
        trace["tiling"] = dict(pad=2)
        trace["pathbar"] = dict(visible=True, textfont=dict(color=OVERVIEW_TEXT))
    layout = dict(height=height, margin=dict(l=4, r=4, t=30, b=4), paper_bgcolor="#ffffff",
                  title=dict(text="Overview: each box's area is the tokens cached under that node (click to zoom)",
                             x=0.01, font=dict(size=13, color=OVERVIEW_TEXT)))
    return figure([trace], layout)
