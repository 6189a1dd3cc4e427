"""The radix tree figure: snapshot -> networkx tree (radixui.figures.tree_layout) -> tidy layout -> plotly.

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
from dataclasses import dataclass, field
from typing import Optional, Sequence

import plotly.graph_objects as go

from core.observe.snapshot import CacheSnapshot, NodeView
from radixui.figures.fmt import (
    TokenText,
    clean,
    fmt_time,
    html_escape,
    resolve_token_text,
    shorten,
    slot_runs,
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
from radixui.figures.tree_layout import MAX_DEPTH, NODE_BUDGET, Folding, snapshot_graph, tidy_layout, visible_tree
from radixui.figures.tree_overview import tree_overview
from radixui.figures.tree_text import (
    FOOTER_LINE_PX,
    edge_label,
    footer_annotation,
    footer_lines,
    footer_notes,
    node_hover,
    node_label,
)

__all__ = ["Highlights", "step_highlights", "node_state", "tree_figure", "tree_overview",
           "snapshot_graph", "tidy_layout", "visible_tree",
           "NODE_BUDGET", "MAX_DEPTH", "FILL", "LEGEND_NAMES", "OUTLINE", "EVICTABLE_OUTLINE", "Ghost"]


MARKER_SIZE = 20
LABEL_MARKER = 28  # labels keep the distance of a marker this big: clear of the dashed split ring
LEVEL_PX = 118     # pixels from one level to the next
CHAR_PX = 6.8      # average width of one character of the 12 px label font


# ----- figure ----------------------------------------------------------------------------------
GHOST_OPACITY = (0.95, 0.6, 0.35)


def _ghost_colour(age: int) -> str:
    """Ghost text and outline: red fading towards grey with age."""
    return ("#dc2626", "#e98b8b", "#f3c4c4")[min(age, 2)]


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


def _group() -> dict:
    return {k: [] for k in ("x", "y", "text", "hover", "line", "lw", "sym", "ids", "op")}


LABEL_RADIUS_PX = LABEL_MARKER / 2   # labels start this far from a node's centre


@dataclass(frozen=True)
class _Frame:
    """The pixel geometry of one drawing, which every label and stroke is placed against."""
    height: int
    margin: dict
    depth: int             # levels below the drawn root
    n_cols: int
    units_per_px: float    # data units per pixel, vertically
    font: int
    chars: int             # label characters that fit in one column
    labels: bool           # whether labels fit at all


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


def _frame_geometry(pos: dict, width: int, height: Optional[int], title: Optional[str]) -> _Frame:
    """Height, margins, scale and font size, so labels can be sized to fit their columns."""
    n_cols = _columns(pos)
    depth = int(round(-min(y for _, y in pos.values())))
    margin = dict(l=10, r=10, t=104 if title else 60, b=34)  # room for a legend that wraps to two rows
    if height is None:
        level_px = LEVEL_PX if depth <= 5 else 100   # deep trees: a little tighter, still 2-line labels
        height = int(level_px * (depth + 1.0)) + margin["t"] + margin["b"]
    plot_h = max(1.0, height - margin["t"] - margin["b"])
    col_px = (width - margin["l"] - margin["r"]) / n_cols
    font = 12 if col_px >= 70 else 10
    chars = int(min(30, (col_px - 8) / (CHAR_PX * font / 12)))
    return _Frame(height=height, margin=margin, depth=depth, n_cols=n_cols, units_per_px=(depth + 1.0) / plot_h,
                  font=font, chars=chars, labels=chars >= 3)


def _edge_text(shown, pos: dict, tt: TokenText, ghost_age: dict, frame: _Frame) -> tuple[dict, dict]:
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
            texts.append(edge_label(view.token_ids, tt, frame.chars) if frame.labels else "")
            hovers.append(("evicted " if child in ghost_age else "") + f"node {view.id}: "
                          + html_escape(shorten(clean(tt(view.token_ids)), 300)))
        colours.append(_ghost_colour(ghost_age[child]) if child in ghost_age else "#111827")
        lines[child] = (texts[-1].count("<br>") + 1) if texts[-1] else 0
        xs.append(x)
        ys.append(y)
    trace = dict(type="scatter", x=xs, y=ys, mode="markers+text", text=texts, textposition="top center",
                 textfont=dict(size=frame.font, color=colours), hovertext=hovers, hoverinfo="text",
                 marker=dict(size=LABEL_MARKER, opacity=0), showlegend=False, name="edge text")
    return trace, lines


def _edge_strokes(shown, pos: dict, root, label_lines: dict, ghost_age: dict, frame: _Frame,
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


@dataclass
class _NodeMarks:
    """The drawn nodes sorted for plotting: one group per fill state, the ids in the circles, rings, the victim."""
    groups: dict = field(default_factory=dict)
    ids: dict = field(default_factory=lambda: {"x": [], "y": [], "text": [], "colour": []})
    split_xy: list = field(default_factory=list)
    victim_xy: Optional[tuple] = None

    def add_id(self, x, y, text: str, colour: str) -> None:
        """Print a node's id inside its circle."""
        self.ids["x"].append(x)
        self.ids["y"].append(y)
        self.ids["text"].append(text)
        self.ids["colour"].append(colour)


def _add_box(group: dict, box: dict, node: tuple, frame: _Frame) -> None:
    """A "+N" box: its tokens under it, and in the hover how to open it."""
    group["text"].append(f"{box['tokens']:,} tok" if frame.labels else "")
    group["hover"].append(f"{box['hidden']} hidden nodes, {box['tokens']:,} tokens: "
                          f"focus node {node[1]} or raise the node budget to see them")
    group["line"].append(OUTLINE)
    group["lw"].append(1.0)
    group["sym"].append("square")
    group["op"].append(1.0)


def _add_ghost(group: dict, view: NodeView, ghost: Ghost, age: int, tt: TokenText, frame: _Frame) -> None:
    """An evicted node: slots struck through (they are free now), faded by age."""
    group["text"].append(f"<s>{html_escape(node_label(view.slots, frame.chars))}</s>" if frame.labels else "")
    group["hover"].append(f"<b>node {view.id}, evicted</b> at time {fmt_time(ghost.evicted_at)} · "
                          f"{len(view.token_ids)} tokens<br>"
                          f"text: {html_escape(shorten(clean(tt(view.token_ids)), 200))}"
                          f"<br>slots {html_escape(slot_runs(view.slots, max_runs=12))} went back to free_pages "
                          f"(their KV stays, stale, until a later alloc overwrites it)")
    group["line"].append(_ghost_colour(age))
    group["lw"].append(2.0)
    group["sym"].append("circle")
    group["op"].append(GHOST_OPACITY[min(age, len(GHOST_OPACITY) - 1)])


def _add_live(group: dict, view: NodeView, state: str, tt: TokenText, highlights: Highlights, victim,
              policy: str, frame: _Frame) -> None:
    """A node of the tree: its slot runs under it, a red outline when it is an evictable leaf."""
    slots = html_escape(node_label(view.slots, frame.chars)) if frame.labels else ""
    group["text"].append("root" if view.parent is None else slots)
    group["hover"].append(node_hover(view, tt, state, view.id == victim, view.id in highlights.split, policy))
    group["line"].append(EVICTABLE_OUTLINE if view.evictable else OUTLINE)
    group["lw"].append(3.2 if view.evictable else 1.5)
    group["sym"].append("circle")
    group["op"].append(1.0)


def _collect_nodes(shown, pos: dict, tt: TokenText, highlights: Highlights, ghost_age: dict,
                   ghosts: Sequence[Ghost], victim, policy: str, frame: _Frame) -> _NodeMarks:
    """Sort the drawn nodes into fill-state groups, so each state is one trace, and note ids, splits and victim."""
    marks = _NodeMarks()
    ghosts_by_id = {g.id: g for g in ghosts}
    for node in shown.nodes:
        x, y = pos[node]
        if isinstance(node, tuple):
            group = marks.groups.setdefault("collapsed", _group())
            _add_box(group, shown.nodes[node], node, frame)
        elif node in ghost_age:
            view = shown.nodes[node]["view"]
            group = marks.groups.setdefault("evicted", _group())
            _add_ghost(group, view, ghosts_by_id[node], ghost_age[node], tt, frame)
            marks.add_id(x, y, str(view.id), _ghost_colour(ghost_age[node]))
        else:
            view = shown.nodes[node]["view"]
            state = node_state(view, highlights)
            group = marks.groups.setdefault(state, _group())
            _add_live(group, view, state, tt, highlights, victim, policy, frame)
            if view.parent is not None:
                marks.add_id(x, y, str(view.id), "#ffffff" if state in ("inserted", "matched", "locked") else "#111827")
            if view.id in highlights.split:
                marks.split_xy.append((x, y))
            if view.id == victim:
                marks.victim_xy = (x, y)
        group["x"].append(x)
        group["y"].append(y)
        group["ids"].append(str(node) if not isinstance(node, tuple) else f"+{node[1]}")
    return marks


def _node_traces(marks: _NodeMarks, font: int) -> list:
    """One marker trace per fill state, then the slot labels and the node ids that sit on them."""
    traces = []
    slot_x, slot_y, slot_text = [], [], []
    for state in ("root", "collapsed", "evicted", *reversed(STATE_ORDER)):
        group = marks.groups.get(state)
        if not group:
            continue
        is_root = state == "root"
        traces.append(dict(
            type="scatter", x=group["x"], y=group["y"], mode="markers+text" if is_root else "markers",
            text=group["text"] if is_root else None, textposition="middle right",
            textfont=dict(size=font - 1, color="#374151", family="monospace"), customdata=group["ids"],
            hovertext=group["hover"], hoverinfo="text", name=LEGEND_NAMES.get(state, state), showlegend=False,
            marker=dict(size=14 if state in ("root", "collapsed") else MARKER_SIZE, color=FILL[state],
                        symbol=group["sym"], line=dict(color=group["line"], width=group["lw"]),
                        opacity=group["op"])))
        if not is_root:
            slot_x += group["x"]
            slot_y += group["y"]
            slot_text += group["text"]
    # slot labels under the nodes, from a wider invisible marker so they clear the split ring
    traces.append(dict(type="scatter", x=slot_x, y=slot_y, mode="markers+text", text=slot_text,
                       textposition="bottom center", textfont=dict(size=font - 1, color="#374151", family="monospace"),
                       hoverinfo="skip", marker=dict(size=LABEL_MARKER, opacity=0), showlegend=False, name="slots"))
    ids = marks.ids
    traces.append(dict(type="scatter", x=ids["x"], y=ids["y"], mode="text", text=ids["text"],
                       textposition="middle center", textfont=dict(size=9 if font >= 12 else 8, color=ids["colour"]),
                       hoverinfo="skip", showlegend=False, name="node ids"))
    return traces


def _split_rings(split_xy: list) -> list:
    """Dashed rings around both halves of every split, drawn as pixel-sized shapes so they hug the marker."""
    ring = MARKER_SIZE / 2 + 3.5
    return [dict(type="circle", xref="x", yref="y", xsizemode="pixel", ysizemode="pixel",
                 xanchor=x, yanchor=y, x0=-ring, x1=ring, y0=-ring, y1=ring,
                 line=dict(color=SPLIT_RING, width=2, dash="dash"), layer="above")
            for x, y in split_xy]


def _victim_marker(victim_xy: tuple, font: int) -> tuple[dict, dict]:
    """A red ✕ on the leaf the eviction heap gives up first, and "next victim" under its slot label."""
    x, y = victim_xy
    cross = dict(type="scatter", x=[x], y=[y], mode="markers", hoverinfo="skip", showlegend=False,
                 marker=dict(size=9, symbol="x-thin", color=VICTIM, line=dict(color=VICTIM, width=3)))
    note = dict(x=x, y=y, xref="x", yref="y", text="next victim", showarrow=False, yanchor="top",
                yshift=-(LABEL_RADIUS_PX + 1.25 * font + 6), font=dict(color=VICTIM, size=font - 1))
    return cross, note


def _layout(snapshot: CacheSnapshot, root, shown, frame: _Frame, shapes: list, annotations: list,
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
    marks = _collect_nodes(shown, pos, tt, h, ghost_age, ghosts, victim, snapshot.policy, frame)
    traces += _node_traces(marks, frame.font)
    traces += _legend_traces(bool(ghost_age))
    annotations = []
    if marks.victim_xy is not None:
        cross, note = _victim_marker(marks.victim_xy, frame.font)
        traces.append(cross)
        annotations.append(note)
    footer = footer_lines(footer_notes(snapshot, focus, views, tt, h, shown, frame.labels), width)
    if footer:
        annotations.append(footer_annotation(footer))
    if len(footer) > 1:          # room under the plot for every line of the footer
        extra = FOOTER_LINE_PX * (len(footer) - 1)
        frame = dataclasses.replace(frame, height=frame.height + extra,
                                    margin=dict(frame.margin, b=frame.margin["b"] + extra))
    return figure(traces, _layout(snapshot, root, shown, frame, _split_rings(marks.split_xy), annotations, title))
