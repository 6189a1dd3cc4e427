"""The radix tree figure: snapshot -> networkx tree (radixui.layout) -> tidy layout -> plotly.

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

import textwrap
from typing import Optional, Sequence

import plotly.graph_objects as go

from core.snapshot import CacheSnapshot, NodeView
from radixui.fmt import (TokenText, clean, fit_runs, fmt_time, html_escape, resolve_token_text, shorten,
                         slot_runs)
from radixui.highlights import Ghost, Highlights, node_state, step_highlights
from radixui.palette import (EDGE, EVICTABLE_OUTLINE, FILL, GHOST_OUTLINE, LEGEND_NAMES, OUTLINE, SPLIT_RING,
                             STATE_ORDER, VICTIM)
from radixui.layout import MAX_DEPTH, NODE_BUDGET, Folding, snapshot_graph, tidy_layout, visible_tree
from radixui.overview import tree_overview
from radixui.plot import figure

__all__ = ["Highlights", "step_highlights", "node_state", "tree_figure", "tree_overview", "edge_label",
           "node_label", "node_hover", "wrap_label", "snapshot_graph", "tidy_layout", "visible_tree",
           "NODE_BUDGET", "MAX_DEPTH", "FILL", "LEGEND_NAMES", "OUTLINE", "EVICTABLE_OUTLINE", "Ghost"]


MARKER_SIZE = 20
LABEL_MARKER = 28  # labels keep the distance of a marker this big: clear of the dashed split ring
LEVEL_PX = 118     # pixels from one level to the next
CHAR_PX = 6.8      # average width of one character of the 12 px label font


# ----- labels ----------------------------------------------------------------------------------
def wrap_label(text: str, width: int, max_lines: int = 2) -> list[str]:
    """Up to `max_lines` lines of at most `width` characters, broken at spaces only: a word never
    splits across lines (one longer than a line is shortened with "…"), and a longer text ends
    its last line with "…"."""
    text = clean(text)
    width = max(1, width)
    if len(text) <= width:
        return [text]
    words = [w if len(w) <= width else shorten(w, width) for w in text.split(" ") if w]
    lines = textwrap.wrap(" ".join(words), width, break_long_words=False, break_on_hyphens=False) or [""]
    if len(lines) <= max_lines:
        return lines
    head = lines[:max_lines - 1]
    out = ""
    for w in " ".join(lines[max_lines - 1:]).split(" "):
        if len(out) + bool(out) + len(w) > width - 1:
            break
        out = f"{out} {w}" if out else w
    return head + [out + "…" if out else shorten(lines[max_lines - 1], width)]


def edge_label(token_ids: Sequence[int], token_text: TokenText, width: int, max_lines: int = 2) -> str:
    """Edge text for the figure: decoded, one line, wrapped to `width` characters, "…" when longer."""
    return "<br>".join(html_escape(line) for line in wrap_label(token_text(token_ids), width, max_lines))


def node_label(slots: Sequence[int], width: int = 24) -> str:
    """Slot runs of a node, cut at whole runs to fit `width`: "1–5", "1, 4–6", "12–530, …"."""
    return fit_runs(slots, max(4, width))


def node_hover(n: NodeView, token_text: TokenText, state: str, is_victim: bool = False,
               was_split: bool = False, policy: str = "lru") -> str:
    """Hover text: full text, slot list, last_access_time, lock_ref, hit_count and the node's flags."""
    text = clean(token_text(n.token_ids))
    lines = [f"<b>node {n.id}</b> · {len(n.token_ids)} token{'s' if len(n.token_ids) != 1 else ''}",
             "text: " + "<br>      ".join(html_escape(line) for line in
                                            textwrap.wrap(shorten(text, 600), 80) or [""]),
             "slots: " + html_escape(slot_runs(n.slots, max_runs=12)),
             f"last_access_time: {fmt_time(n.last_access_time)} · created: {fmt_time(n.creation_time)}",
             f"lock_ref: {n.lock_ref} · hit_count: {n.hit_count}"
             + (f" · priority: {n.priority}" if n.priority else "")]
    flags = [LEGEND_NAMES.get(state, state)]
    if n.evictable:
        flags.append("evictable leaf")
    if was_split:
        flags.append("just split")
    if is_victim:
        flags.append(f"next eviction victim ({policy})")
    lines.append(" · ".join(flags))
    if n.extra_key is not None:
        lines.append(f"extra_key: {html_escape(str(n.extra_key))}")
    return "<br>".join(lines)


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
    views = {n.id: n for n in snapshot.nodes}
    children: dict = {n: [] for n in views}
    for n in snapshot.nodes:
        if n.parent is not None:
            children[n.parent].append(n.id)
    ghost_age: dict = {}
    pending = [g for g in ghosts if g.id not in views]
    while pending:
        placed = [g for g in pending if g.parent in views]
        if not placed:
            break
        for g in placed:
            views[g.id] = g.view()
            children[g.parent].append(g.id)
            children[g.id] = []
            ghost_age[g.id] = g.age
        pending = [g for g in pending if g.id not in views]
    root = snapshot.root_id if focus is None else focus
    if root not in views:
        raise ValueError(f"node {focus} is not in the tree (evicted, or from another snapshot); "
                         f"pick one of the ids shown in the tree")
    victim = snapshot.eviction_order[0] if snapshot.eviction_order else None
    keep = [n for n in (*h.inserted, *h.matched, *h.split, victim, *ghost_age) if n is not None and n in views]
    folding = Folding(children, views, root, max_depth)
    max_cols = max(1.0, (width - 20) / min_column_px)
    budget = node_budget
    for _ in range(8):  # fewer nodes until the columns are wide enough to label
        disp = folding.display(budget, keep)
        pos = tidy_layout(disp, root)
        n_cols = 1 + max(x for x, _ in pos.values())
        if n_cols <= max_cols or budget <= 8:
            break
        budget = max(8, min(budget - 1, int(budget * max_cols / n_cols * 0.9)))
    depth = int(round(-min(y for _, y in pos.values())))
    margin = dict(l=10, r=10, t=104 if title else 60, b=34)  # room for a legend that wraps to two rows
    if height is None:
        level_px = LEVEL_PX if depth <= 5 else 100   # deep trees: a little tighter, still 2-line labels
        height = int(level_px * (depth + 1.0)) + margin["t"] + margin["b"]
    plot_h = max(1.0, height - margin["t"] - margin["b"])
    u = (depth + 1.0) / plot_h                      # data units per pixel, vertically
    col_px = (width - margin["l"] - margin["r"]) / n_cols
    font = 12 if col_px >= 70 else 10
    chars = int(min(30, (col_px - 8) / (CHAR_PX * font / 12)))
    labels = chars >= 3

    # edge labels first: how many lines each child's label takes decides where its stroke stops
    lx, ly, lt, lh, lc, lines = [], [], [], [], [], {}
    for p, c in disp.edges:
        cx, cy = pos[c]
        if isinstance(c, tuple):
            a = disp.nodes[c]
            text = f"+{a['hidden']} node{'s' if a['hidden'] != 1 else ''}"
            lt.append(text if len(text) <= chars else f"+{a['hidden']}")
            lh.append(f"{a['hidden']} nodes in {a['subtrees']} collapsed subtree{'s' if a['subtrees'] != 1 else ''}, "
                      f"{a['tokens']:,} tokens")
        else:
            v = disp.nodes[c]["view"]
            lt.append(edge_label(v.token_ids, tt, chars) if labels else "")
            lh.append(("evicted " if c in ghost_age else "") + f"node {v.id}: "
                      + html_escape(shorten(clean(tt(v.token_ids)), 300)))
        lc.append(_ghost_colour(ghost_age[c]) if c in ghost_age else "#111827")
        lines[c] = (lt[-1].count("<br>") + 1) if lt[-1] else 0
        lx.append(cx)
        ly.append(cy)

    # edges: elbows from under the parent's slot label to a bar, along it, down to the child's text
    ex: list = []
    ey: list = []
    gx: list = []
    gy: list = []
    r_px = LABEL_MARKER / 2   # labels start this far from a node's centre
    for p, c in disp.edges:
        (px, py), (cx, cy) = pos[p], pos[c]
        top = py - (r_px + (4 if p == root else 4 + 1.25 * font + 4)) * u
        bar = py - 0.40
        bottom = cy + (r_px + 4 + 1.25 * font * lines[c]) * u
        xs, ys = (gx, gy) if c in ghost_age else (ex, ey)
        xs += [px, px, cx, cx, None]
        ys += [top, bar, bar, min(bottom, bar - 0.02), None]
    traces: list = [dict(type="scatter", x=ex, y=ey, mode="lines", line=dict(color=EDGE, width=1.6),
                         hoverinfo="skip", showlegend=False, name="edges")]
    if gx:
        traces.append(dict(type="scatter", x=gx, y=gy, mode="lines", hoverinfo="skip", showlegend=False,
                           line=dict(color=GHOST_OUTLINE, width=1.4, dash="dot"), name="ghost edges"))
    traces.append(dict(type="scatter", x=lx, y=ly, mode="markers+text", text=lt, textposition="top center",
                       textfont=dict(size=font, color=lc), hovertext=lh, hoverinfo="text",
                       marker=dict(size=LABEL_MARKER, opacity=0), showlegend=False, name="edge text"))

    # nodes, one trace per fill state; the slot label sits under each node
    groups: dict[str, dict] = {}
    split_xy, victim_xy = [], None
    ids_x, ids_y, ids_t, ids_c = [], [], [], []   # node ids, printed inside the circles
    ghosts_by_id = {g.id: g for g in ghosts}
    for n in disp.nodes:
        x, y = pos[n]
        if isinstance(n, tuple):
            a = disp.nodes[n]
            g = groups.setdefault("collapsed", _group())
            g["text"].append(f"{a['tokens']:,} tok" if labels else "")
            g["hover"].append(f"{a['hidden']} hidden nodes, {a['tokens']:,} tokens: "
                              f"focus node {n[1]} or raise the node budget to see them")
            g["line"].append(OUTLINE); g["lw"].append(1.0); g["sym"].append("square")
        elif n in ghost_age:
            v = disp.nodes[n]["view"]
            g = groups.setdefault("evicted", _group())
            g["text"].append(f"<s>{html_escape(node_label(v.slots, chars))}</s>" if labels else "")
            g["hover"].append(f"<b>node {v.id}, evicted</b> at time {fmt_time(ghosts_by_id[n].evicted_at)} · "
                              f"{len(v.token_ids)} tokens<br>text: {html_escape(shorten(clean(tt(v.token_ids)), 200))}"
                              f"<br>slots {html_escape(slot_runs(v.slots, max_runs=12))} went back to free_pages "
                              f"(their KV stays, stale, until a later alloc overwrites it)")
            g["line"].append(_ghost_colour(ghost_age[n])); g["lw"].append(2.0); g["sym"].append("circle")
            g["op"].append(GHOST_OPACITY[min(ghost_age[n], len(GHOST_OPACITY) - 1)])
            ids_x.append(x); ids_y.append(y); ids_t.append(str(v.id)); ids_c.append(_ghost_colour(ghost_age[n]))
        else:
            v = disp.nodes[n]["view"]
            state = node_state(v, h)
            g = groups.setdefault(state, _group())
            g["text"].append("root" if v.parent is None else (html_escape(node_label(v.slots, chars)) if labels else ""))
            g["hover"].append(node_hover(v, tt, state, v.id == victim, v.id in h.split, snapshot.policy))
            g["line"].append(EVICTABLE_OUTLINE if v.evictable else OUTLINE)
            g["lw"].append(3.2 if v.evictable else 1.5)
            g["sym"].append("circle")
            if v.parent is not None:
                ids_x.append(x); ids_y.append(y); ids_t.append(str(v.id))
                ids_c.append("#ffffff" if state in ("inserted", "matched", "locked") else "#111827")
            if v.id in h.split:
                split_xy.append((x, y))
            if v.id == victim:
                victim_xy = (x, y)
        g["x"].append(x); g["y"].append(y); g["ids"].append(str(n) if not isinstance(n, tuple) else f"+{n[1]}")
        if len(g["op"]) < len(g["x"]):
            g["op"].append(1.0)
    sx, sy, st_ = [], [], []
    for state in ("root", "collapsed", "evicted", *reversed(STATE_ORDER)):
        g = groups.get(state)
        if not g:
            continue
        root_text = state == "root"
        traces.append(dict(
            type="scatter", x=g["x"], y=g["y"], mode="markers+text" if root_text else "markers",
            text=g["text"] if root_text else None, textposition="middle right",
            textfont=dict(size=font - 1, color="#374151", family="monospace"), customdata=g["ids"],
            hovertext=g["hover"], hoverinfo="text", name=LEGEND_NAMES.get(state, state), showlegend=False,
            marker=dict(size=14 if state in ("root", "collapsed") else MARKER_SIZE, color=FILL[state],
                        symbol=g["sym"], line=dict(color=g["line"], width=g["lw"]), opacity=g["op"])))
        if not root_text:
            sx += g["x"]; sy += g["y"]; st_ += g["text"]
    # slot labels under the nodes, from a wider invisible marker so they clear the split ring
    traces.append(dict(type="scatter", x=sx, y=sy, mode="markers+text", text=st_, textposition="bottom center",
                       textfont=dict(size=font - 1, color="#374151", family="monospace"), hoverinfo="skip",
                       marker=dict(size=LABEL_MARKER, opacity=0), showlegend=False, name="slots"))
    traces.append(dict(type="scatter", x=ids_x, y=ids_y, mode="text", text=ids_t, textposition="middle center",
                       textfont=dict(size=9 if font >= 12 else 8, color=ids_c), hoverinfo="skip",
                       showlegend=False, name="node ids"))
    traces.extend(_legend_traces(bool(ghost_age)))

    ring = MARKER_SIZE / 2 + 3.5
    shapes = [dict(type="circle", xref="x", yref="y", xsizemode="pixel", ysizemode="pixel",
                   xanchor=x, yanchor=y, x0=-ring, x1=ring, y0=-ring, y1=ring,
                   line=dict(color=SPLIT_RING, width=2, dash="dash"), layer="above")
              for x, y in split_xy]
    annotations = []
    if victim_xy is not None:
        traces.append(dict(type="scatter", x=[victim_xy[0]], y=[victim_xy[1]], mode="markers", hoverinfo="skip",
                           showlegend=False, marker=dict(size=9, symbol="x-thin", color=VICTIM,
                                                         line=dict(color=VICTIM, width=3))))
        annotations.append(dict(x=victim_xy[0], y=victim_xy[1], xref="x", yref="y", text="next victim",
                                showarrow=False, yanchor="top", yshift=-(r_px + 1.25 * font + 6),
                                font=dict(color=VICTIM, size=font - 1)))
    footer = []
    if focus is not None and focus != snapshot.root_id:
        path, n = [], views[focus]
        while n.parent is not None:
            path.append(n)
            n = views[n.parent]
        prefix = clean(tt([t for v in reversed(path) for t in v.token_ids]))
        footer.append(f"focused on node {focus}, prefix '{html_escape(shorten(prefix, 60))}' "
                      f"({len(path)} level{'s' if len(path) != 1 else ''} below the root)")
    if h.evicted_nodes:
        gone = "; ".join(f"node {nid} '{html_escape(shorten(clean(tt(toks)), 40))}' (slots {slot_runs(sl, max_runs=3)})"
                         for nid, toks, sl in h.evicted_nodes[:3])
        more = f" and {len(h.evicted_nodes) - 3} more" if len(h.evicted_nodes) > 3 else ""
        footer.append(f"<span style='color:{VICTIM}'>evicted this step: {gone}{more}</span>")
    boxes = [n for n in disp.nodes if isinstance(n, tuple)]
    if boxes:
        n_hidden = sum(disp.nodes[n]["hidden"] for n in boxes)
        footer.append(f"{n_hidden:,} of {len(views):,} nodes folded into {len(boxes)} “+N” "
                      f"boxes: focus a node to open its subtree")
    if not labels:
        footer.append("labels hidden at this size: hover a node, or focus a subtree")
    if footer:
        annotations.append(dict(xref="paper", yref="paper", x=0, y=0, xanchor="left", yanchor="top", yshift=-6,
                                showarrow=False, align="left", font=dict(color="#4b5563", size=12),
                                text=" · ".join(footer)))
    layout = dict(
        height=height, margin=margin,
        plot_bgcolor="#ffffff", paper_bgcolor="#ffffff", hovermode="closest", dragmode="pan",
        legend=dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom", font=dict(size=12),
                    itemclick=False, itemdoubleclick=False),
        xaxis=dict(visible=False, range=[-0.5, n_cols - 0.5]),
        yaxis=dict(visible=False, range=[-depth - 0.5, 0.5]),
        shapes=shapes, annotations=annotations,
        hoverlabel=dict(bgcolor="#ffffff", font=dict(size=12, family="monospace"), align="left"),
        meta=dict(seq=snapshot.seq, root=root, nodes=disp.number_of_nodes(), columns=n_cols, chars=chars),
    )
    if title:
        layout["title"] = dict(text=title, x=0.01, xref="container", y=0.995, yref="container", yanchor="top",
                               font=dict(size=15))
    return figure(traces, layout)


