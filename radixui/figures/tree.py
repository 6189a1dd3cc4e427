"""The radix tree figure: snapshot -> networkx tree (radixui.figures.tree_layout) -> tidy layout -> node
marks (radixui.figures.tree_marks) -> plotly.

Each edge carries its decoded token text (over the child, wrapped to its column, "…" inside long
runs), each node its slots (under it, runs compressed: "1–5", "1, 4–6"); hover shows the full
text, slot list, last_access_time, lock_ref and hit_count.

Colours follow the LMSYS RadixAttention figure: green = inserted this step, blue = matched this
step, grey = locked by a running request, white = cached; red outline = evictable leaf, dashed
ring = just split, and a red ✕ with "next victim" on the leaf the eviction heap gives up first.
"This step" is a `Highlights` made from that step's events by `step_highlights`. Large trees fold
small subtrees into "+N" nodes (a node budget, a depth limit, and columns wide enough to label);
`focus` draws one subtree; `tree_overview` sizes every node by its tokens (icicle / treemap).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import plotly.graph_objects as go

from core.observe.snapshot import CacheSnapshot
from radixui.figures.fmt import (
    TokenText,
    clean,
    html_escape,
    resolve_token_text,
    shorten,
)
from radixui.figures.highlights import Ghost, Highlights, node_state, step_highlights
from radixui.figures.palette import (
    EDGE,
    EVICTABLE_OUTLINE,
    FILL,
    GHOST_OUTLINE,
    LEGEND_NAMES,
    OUTLINE,
    SPLIT_RING,
    STATE_ORDER,
    VICTIM,
)
from radixui.figures.plot import figure
from radixui.figures.tree_marks import (
    LABEL_RADIUS_PX,
    MARKER_SIZE,
    Frame,
    collect_nodes,
    ghost_colour,
    node_traces,
    split_rings,
    victim_marker,
)
from radixui.figures.tree_layout import MAX_DEPTH, NODE_BUDGET, Folding, snapshot_graph, tidy_layout, visible_tree
from radixui.figures.tree_overview import tree_overview
from radixui.figures.tree_text import (
    FOOTER_LINE_PX,
    edge_label,
    footer_annotation,
    footer_lines,
    footer_notes,
)

__all__ = ["Highlights", "step_highlights", "node_state", "tree_figure", "tree_overview",
           "snapshot_graph", "tidy_layout", "visible_tree",
           "NODE_BUDGET", "MAX_DEPTH", "FILL", "LEGEND_NAMES", "OUTLINE", "EVICTABLE_OUTLINE", "Ghost"]


LEVEL_PX = 118     # pixels from one level to the next
CHAR_PX = 6.8      # average width of one character of the 12 px label font
# A level holds the child's label, its circle and its slot text: two label lines need this many pixels, and
# below TIGHT_LEVEL_PX the labels shrink to the 10 px font (a squeezed tree: the Live page's height cap).
TWO_LINE_LEVEL_PX = 80
TIGHT_LEVEL_PX = 62


# ----- figure ----------------------------------------------------------------------------------
def _legend_traces(ghosts: bool = False) -> list:
    def entry(name: str, **marker) -> dict:
        return dict(type="scatter", x=[None], y=[None], mode="markers", name=name, showlegend=True,
                    hoverinfo="skip", marker=marker)
    out = [entry(LEGEND_NAMES[s], size=13, color=FILL[s], line=dict(color=OUTLINE, width=1.5))
           for s in STATE_ORDER]
    out.append(entry("evictable leaf", size=13, color="#ffffff", line=dict(color=EVICTABLE_OUTLINE, width=3)))
    out.append(entry("just split", size=15, symbol="circle-open-dot", color=SPLIT_RING,
                     line=dict(color=SPLIT_RING, width=1.5)))
    out.append(entry("next victim", size=12, symbol="x-thin", color=VICTIM, line=dict(color=VICTIM, width=3)))
    if ghosts:
        out.append(entry(LEGEND_NAMES["evicted"] + " ", size=13, color=FILL["evicted"],
                         line=dict(color=GHOST_OUTLINE, width=2)))
    return out


def _place_ghosts(snapshot: CacheSnapshot, ghosts: Sequence[Ghost]) -> tuple[dict, dict, dict]:
    """Views and children of the tree plus the ghosts whose parent is drawn, so evicted nodes show where they were."""
    views = {n.id: n for n in snapshot.nodes}
    children: dict = {n: [] for n in views}
    for n in snapshot.nodes:
        if n.parent is not None:
            children[n.parent].append(n.id)
    ghost_age: dict = {}
    pending = [g for g in ghosts if g.id not in views]
    while pending:  # a ghost can hang under another ghost: place parents first
        placed = [g for g in pending if g.parent in views]
        if not placed:
            break
        for ghost in placed:
            views[ghost.id] = ghost.view()
            children[ghost.parent].append(ghost.id)
            children[ghost.id] = []
            ghost_age[ghost.id] = ghost.age
        pending = [g for g in pending if g.id not in views]
    return views, children, ghost_age


def _columns(pos: dict):
    """How many columns the tidy layout uses."""
    return 1 + max(x for x, _ in pos.values())


def _fold_to_fit(folding: Folding, root, keep: list, node_budget: int, width: int,
                 min_column_px: float) -> tuple:
    """Fold more nodes into "+N" boxes until every column is wide enough to carry a label."""
    max_cols = max(1.0, (width - 20) / min_column_px)
    budget = node_budget
    for _ in range(8):
        shown = folding.display(budget, keep)
        pos = tidy_layout(shown, root)
        n_cols = _columns(pos)
        if n_cols <= max_cols or budget <= 8:
            break
        budget = max(8, min(budget - 1, int(budget * max_cols / n_cols * 0.9)))
    return shown, pos


def _frame_geometry(pos: dict, width: int, height: Optional[int], title: Optional[str]) -> Frame:
    """Height, margins, scale and font size, so labels can be sized to fit their columns."""
    n_cols = _columns(pos)
    depth = int(round(-min(y for _, y in pos.values())))
    margin = dict(l=10, r=10, t=104 if title else 60, b=34)  # room for a legend that wraps to two rows
    if height is None:
        level_px = LEVEL_PX if depth <= 5 else 100   # deep trees: a little tighter, still 2-line labels
        height = int(level_px * (depth + 1.0)) + margin["t"] + margin["b"]
    plot_h = max(1.0, height - margin["t"] - margin["b"])
    col_px = (width - margin["l"] - margin["r"]) / n_cols
    level_px = plot_h / (depth + 1.0)
    font = 12 if col_px >= 70 and level_px >= TIGHT_LEVEL_PX else 10
    chars = int(min(30, (col_px - 8) / (CHAR_PX * font / 12)))
    return Frame(height=height, margin=margin, depth=depth, n_cols=n_cols, units_per_px=(depth + 1.0) / plot_h,
                  font=font, chars=chars, labels=chars >= 3, label_lines=2 if level_px >= TWO_LINE_LEVEL_PX else 1,
                  tight=level_px < TIGHT_LEVEL_PX)


def _edge_text(shown, pos: dict, tt: TokenText, ghost_age: dict, frame: Frame) -> tuple[dict, dict]:
    """The edge label trace, and how many lines each child's label takes (that decides where its stroke stops)."""
    xs, ys, texts, hovers, colours, lines = [], [], [], [], [], {}
    for _, child in shown.edges:
        x, y = pos[child]
        if isinstance(child, tuple):
            box = shown.nodes[child]
            text = f"+{box['hidden']} node{'s' if box['hidden'] != 1 else ''}"
            texts.append(text if len(text) <= frame.chars else f"+{box['hidden']}")
            hovers.append(f"{box['hidden']} nodes in {box['subtrees']} collapsed "
                          f"subtree{'s' if box['subtrees'] != 1 else ''}, {box['tokens']:,} tokens")
        else:
            view = shown.nodes[child]["view"]
            texts.append(edge_label(view.token_ids, tt, frame.chars, frame.label_lines) if frame.labels else "")
            hovers.append(("evicted " if child in ghost_age else "") + f"node {view.id}: "
                          + html_escape(shorten(clean(tt(view.token_ids)), 300)))
        colours.append(ghost_colour(ghost_age[child]) if child in ghost_age else "#111827")
        lines[child] = (texts[-1].count("<br>") + 1) if texts[-1] else 0
        xs.append(x)
        ys.append(y)
    trace = dict(type="scatter", x=xs, y=ys, mode="markers+text", text=texts, textposition="top center",
                 textfont=dict(size=frame.font, color=colours), hovertext=hovers, hoverinfo="text",
                 marker=dict(size=frame.label_marker, opacity=0), showlegend=False, name="edge text")
    return trace, lines


def _edge_strokes(shown, pos: dict, root, label_lines: dict, ghost_age: dict, frame: Frame,
                  victim=None) -> list:
    """Elbows from under the parent's slot label (and under "next victim" on the victim, whose only
    children are ghosts) to a bar, along it, down to the child's text; ghost edges dotted."""
    u, font = frame.units_per_px, frame.font
    live_x: list = []
    live_y: list = []
    ghost_x: list = []
    ghost_y: list = []
    for parent, child in shown.edges:
        (px, py), (cx, cy) = pos[parent], pos[child]
        if frame.tight:      # under the parent's circle (its slots are beside it), over the child's one-line label
            top = py - (MARKER_SIZE / 2 + 2) * u
            bottom = cy + (frame.label_marker / 2 + 2 + 1.25 * font * label_lines[child]) * u
            bar = (top + bottom) / 2 if bottom < top else top
        else:
            top = py - (LABEL_RADIUS_PX + (4 if parent == root else 4 + 1.25 * font + 4)
                        + (1.25 * font + 4 if parent == victim else 0)) * u
            bar = py - 0.40
            bottom = cy + (LABEL_RADIUS_PX + 4 + 1.25 * font * label_lines[child]) * u
        xs, ys = (ghost_x, ghost_y) if child in ghost_age else (live_x, live_y)
        xs += [px, px, cx, cx, None]
        ys += [top, bar, bar, min(bottom, bar - 0.02), None]
    traces: list = [dict(type="scatter", x=live_x, y=live_y, mode="lines", line=dict(color=EDGE, width=1.6),
                         hoverinfo="skip", showlegend=False, name="edges")]
    if ghost_x:
        traces.append(dict(type="scatter", x=ghost_x, y=ghost_y, mode="lines", hoverinfo="skip", showlegend=False,
                           line=dict(color=GHOST_OUTLINE, width=1.4, dash="dot"), name="ghost edges"))
    return traces


def _layout(snapshot: CacheSnapshot, root, shown, frame: Frame, shapes: list, annotations: list,
            title: Optional[str]) -> dict:
    """The layout: axes fitted to the columns and levels, a one-row legend, and meta for tests and callers."""
    layout = dict(
        height=frame.height, margin=frame.margin,
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff", hovermode="closest", dragmode="pan",
        legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom", font=dict(size=12),
                    itemclick=False, itemdoubleclick=False),
        xaxis=dict(visible=False, range=[-0.5, frame.n_cols - 0.5]),
        yaxis=dict(visible=False, range=[-frame.depth - 0.5, 0.5]),
        shapes=shapes, annotations=annotations,
        hoverlabel=dict(bgcolor="#ffffff", font=dict(size=12, family="monospace"), align="left"),
        meta=dict(seq=snapshot.seq, root=root, nodes=shown.number_of_nodes(), columns=frame.n_cols,
                  chars=frame.chars),
    )
    if title:
        layout["title"] = dict(text=title, x=0.01, xref="container", y=0.995, yref="container", yanchor="top",
                               font=dict(size=15))
    return layout


def tree_figure(snapshot: CacheSnapshot, token_text: Optional[TokenText] = None,
                highlights: Optional[Highlights] = None, focus: Optional[int] = None,
                node_budget: int = NODE_BUDGET, max_depth: Optional[int] = MAX_DEPTH,
                width: int = 1200, min_column_px: float = 80, height: Optional[int] = None,
                title: Optional[str] = None, ghosts: Sequence[Ghost] = ()) -> go.Figure:
    """The radix tree as a plotly figure (see the module docstring for the encoding).

    token_text: decodes a run of token ids (default: the ids themselves).
    highlights: what changed this step (`step_highlights(events)`).
    focus: draw only the subtree under this node id (ValueError if it is not in the tree).
    node_budget, max_depth: beyond these, small or deep subtrees collapse into "+N" nodes; the
        nodes of `highlights` and the next victim always stay visible.
    width: the pixel width the figure will get (it autosizes); with `min_column_px` it caps the
        columns, folding more nodes until every column can carry a label.
    height: pixels; by default 118 per level.
    ghosts: nodes evicted lately (`ghosts_from_events`), drawn where they were, fading with age,
        with their slots struck through (those slots are free now, their KV stale).
    """
    tt = resolve_token_text(token_text)
    h = highlights or Highlights()
    views, children, ghost_age = _place_ghosts(snapshot, ghosts)
    root = snapshot.root_id if focus is None else focus
    if root not in views:
        raise ValueError(f"node {focus} is not in the tree (evicted, or from another snapshot); "
                         f"pick one of the ids shown in the tree")
    victim = snapshot.eviction_order[0] if snapshot.eviction_order else None
    keep = [n for n in (*h.inserted, *h.matched, *h.split, victim, *ghost_age) if n is not None and n in views]
    shown, pos = _fold_to_fit(Folding(children, views, root, max_depth), root, keep, node_budget, width,
                              min_column_px)
    frame = _frame_geometry(pos, width, height, title)

    edge_text, label_lines = _edge_text(shown, pos, tt, ghost_age, frame)
    traces = _edge_strokes(shown, pos, root, label_lines, ghost_age, frame, victim) + [edge_text]
    marks = collect_nodes(shown, pos, tt, h, ghost_age, ghosts, victim, snapshot.policy, frame)
    traces += node_traces(marks, frame)
    traces += _legend_traces(bool(ghost_age))
    annotations = []
    if marks.victim_xy is not None:
        cross, note = victim_marker(marks.victim_xy, frame)
        traces.append(cross)
        if note is not None:
            annotations.append(note)
    footer = footer_lines(footer_notes(snapshot, focus, views, tt, h, shown, frame.labels), width)
    if footer:
        annotations.append(footer_annotation(footer))
    if len(footer) > 1:          # room under the plot for every line of the footer
        extra = FOOTER_LINE_PX * (len(footer) - 1)
        frame = dataclasses.replace(frame, height=frame.height + extra,
                                    margin=dict(frame.margin, b=frame.margin["b"] + extra))
    return figure(traces, _layout(snapshot, root, shown, frame, split_rings(marks.split_xy), annotations, title))
