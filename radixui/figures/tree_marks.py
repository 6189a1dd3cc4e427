"""The nodes of the radix tree figure (radixui.figures.tree): one marker trace per fill state (live
nodes by state, "+N" boxes, ghosts of evicted nodes fading with age), their slot labels and ids, the
dashed rings of a split and the red cross on the next victim, all placed against one drawing's `Frame`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from core.observe.snapshot import NodeView
from radixui.figures.fmt import TokenText, clean, fmt_time, html_escape, shorten, slot_runs
from radixui.figures.highlights import Ghost, Highlights, node_state
from radixui.figures.palette import EVICTABLE_OUTLINE, FILL, LEGEND_NAMES, OUTLINE, SPLIT_RING, STATE_ORDER, VICTIM
from radixui.figures.tree_text import node_hover, node_label

MARKER_SIZE = 20
LABEL_MARKER = 28  # labels keep the distance of a marker this big: clear of the dashed split ring
LABEL_RADIUS_PX = LABEL_MARKER / 2   # labels start this far from a node's centre
TIGHT_LABEL_MARKER = 22   # the same on a tight frame (levels too close for the ring's clearance)
GHOST_OPACITY = (0.95, 0.6, 0.35)


def ghost_colour(age: int) -> str:
    """Ghost text and outline: red fading towards grey with age."""
    return ("#dc2626", "#e98b8b", "#f3c4c4")[min(age, 2)]


@dataclass(frozen=True)
class Frame:
    """The pixel geometry of one drawing, which every label and stroke is placed against."""
    height: int
    margin: dict
    depth: int             # levels below the drawn root
    n_cols: int
    units_per_px: float    # data units per pixel, vertically
    font: int
    chars: int             # label characters that fit in one column
    labels: bool           # whether labels fit at all
    label_lines: int = 2   # lines an edge label may take: 1 where levels are too close for 2
    tight: bool = False    # levels too close for a slot label under each node: it goes to the node's right

    @property
    def label_marker(self) -> int:
        """The invisible marker edge labels sit on: how far above a node its label starts."""
        return TIGHT_LABEL_MARKER if self.tight else LABEL_MARKER

    @property
    def slot_chars(self) -> int:
        """Characters of a slot label: the column's, or half of it beside the node."""
        return max(4, self.chars // 2) if self.tight else self.chars


def _group() -> dict:
    return {k: [] for k in ("x", "y", "text", "hover", "line", "lw", "sym", "ids", "op")}


@dataclass
class NodeMarks:
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


def _add_box(group: dict, box: dict, node: tuple, frame: Frame) -> None:
    """A "+N" box: its tokens under it, and in the hover how to open it."""
    group["text"].append(f"{box['tokens']:,} tok" if frame.labels else "")
    group["hover"].append(f"{box['hidden']} hidden nodes, {box['tokens']:,} tokens: "
                          f"focus node {node[1]} or raise the node budget to see them")
    group["line"].append(OUTLINE)
    group["lw"].append(1.0)
    group["sym"].append("square")
    group["op"].append(1.0)


def _add_ghost(group: dict, view: NodeView, ghost: Ghost, age: int, tt: TokenText, frame: Frame) -> None:
    """An evicted node: slots struck through (they are free now), faded by age."""
    group["text"].append(f"<s>{html_escape(node_label(view.slots, frame.slot_chars))}</s>" if frame.labels else "")
    group["hover"].append(f"<b>node {view.id}, evicted</b> at time {fmt_time(ghost.evicted_at)} · "
                          f"{len(view.token_ids)} tokens<br>"
                          f"text: {html_escape(shorten(clean(tt(view.token_ids)), 200))}"
                          f"<br>slots {html_escape(slot_runs(view.slots, max_runs=12))} went back to free_pages "
                          f"(their KV stays, stale, until a later alloc overwrites it)")
    group["line"].append(ghost_colour(age))
    group["lw"].append(2.0)
    group["sym"].append("circle")
    group["op"].append(GHOST_OPACITY[min(age, len(GHOST_OPACITY) - 1)])


def _add_live(group: dict, view: NodeView, state: str, tt: TokenText, highlights: Highlights, victim,
              policy: str, frame: Frame) -> None:
    """A node of the tree: its slot runs under it, a red outline when it is an evictable leaf."""
    slots = html_escape(node_label(view.slots, frame.slot_chars)) if frame.labels else ""
    group["text"].append("root" if view.parent is None else slots)
    group["hover"].append(node_hover(view, tt, state, view.id == victim, view.id in highlights.split, policy))
    group["line"].append(EVICTABLE_OUTLINE if view.evictable else OUTLINE)
    group["lw"].append(3.2 if view.evictable else 1.5)
    group["sym"].append("circle")
    group["op"].append(1.0)


def collect_nodes(shown, pos: dict, tt: TokenText, highlights: Highlights, ghost_age: dict,
                   ghosts: Sequence[Ghost], victim, policy: str, frame: Frame) -> NodeMarks:
    """Sort the drawn nodes into fill-state groups, so each state is one trace, and note ids, splits and victim."""
    marks = NodeMarks()
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
            marks.add_id(x, y, str(view.id), ghost_colour(ghost_age[node]))
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


def node_traces(marks: NodeMarks, frame: Frame) -> list:
    """One marker trace per fill state, then the slot labels (under each node, or beside it on a tight frame)
    and the node ids that sit on them."""
    font = frame.font
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
                       textposition="middle right" if frame.tight else "bottom center",
                       textfont=dict(size=font - 1, color="#374151", family="monospace"), hoverinfo="skip",
                       marker=dict(size=frame.label_marker, opacity=0), showlegend=False, name="slots"))
    ids = marks.ids
    traces.append(dict(type="scatter", x=ids["x"], y=ids["y"], mode="text", text=ids["text"],
                       textposition="middle center", textfont=dict(size=9 if font >= 12 else 8, color=ids["colour"]),
                       hoverinfo="skip", showlegend=False, name="node ids"))
    return traces


def split_rings(split_xy: list) -> list:
    """Dashed rings around both halves of every split, drawn as pixel-sized shapes so they hug the marker."""
    ring = MARKER_SIZE / 2 + 3.5
    return [dict(type="circle", xref="x", yref="y", xsizemode="pixel", ysizemode="pixel",
                 xanchor=x, yanchor=y, x0=-ring, x1=ring, y0=-ring, y1=ring,
                 line=dict(color=SPLIT_RING, width=2, dash="dash"), layer="above")
            for x, y in split_xy]


def victim_marker(victim_xy: tuple, frame: Frame) -> tuple[dict, Optional[dict]]:
    """A red ✕ on the leaf the eviction heap gives up first, and "next victim" under its slot label (on a tight
    frame there is no room under it: the legend's ✕ names it)."""
    x, y = victim_xy
    font = frame.font
    cross = dict(type="scatter", x=[x], y=[y], mode="markers", hoverinfo="skip", showlegend=False,
                 marker=dict(size=9, symbol="x-thin", color=VICTIM, line=dict(color=VICTIM, width=3)))
    if frame.tight:
        return cross, None
    note = dict(x=x, y=y, xref="x", yref="y", text="next victim", showarrow=False, yanchor="top",
                yshift=-(LABEL_RADIUS_PX + 1.25 * font + 6), font=dict(color=VICTIM, size=font - 1))
    return cross, note
