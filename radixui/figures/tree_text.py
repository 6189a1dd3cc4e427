"""Text on the radix tree figure: edge labels (decoded tokens wrapped to their column), node labels
(slot runs), hover text, and the footer's notes on what the drawing cannot show (the focused prefix,
nodes evicted this step, folded boxes), wrapped to the figure's width so none runs off its edge."""
from __future__ import annotations

import re
import textwrap
from typing import Sequence

from core.observe.snapshot import CacheSnapshot, NodeView
from radixui.figures.fmt import TokenText, clean, fit_runs, fmt_time, html_escape, shorten, slot_runs
from radixui.figures.highlights import Highlights
from radixui.figures.palette import LEGEND_NAMES, VICTIM


def wrap_label(text: str, width: int, max_lines: int = 2) -> list[str]:
    """Up to `max_lines` lines of at most `width` characters, broken at spaces only: a word never
    splits across lines (one longer than a line is shortened with "…"), and a longer text ends
    its last line with "…"."""
    text = clean(text)
    width = max(1, width)
    if len(text) <= width:
        return [text]
    # a newline ("⏎") is a break too: "<|im_start|>system⏎You" is two words, so shortening the
    # template's long first word never swallows the "You" after it
    words = [w if len(w) <= width else shorten(w, width) for w in text.replace("⏎", "⏎ ").split(" ") if w]
    lines = textwrap.wrap(" ".join(words), width, break_long_words=False, break_on_hyphens=False) or [""]
    if len(lines) <= max_lines:
        return [line.replace("⏎ ", "⏎") for line in lines]
    head = lines[:max_lines - 1]
    out = ""
    for w in " ".join(lines[max_lines - 1:]).split(" "):
        if len(out) + bool(out) + len(w) > width - 1:
            break
        out = f"{out} {w}" if out else w
    return [line.replace("⏎ ", "⏎") for line in head + [out + "…" if out else shorten(lines[max_lines - 1], width)]]


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


def focus_note(views: dict, focus, tt: TokenText) -> str:
    """Which prefix a focused subtree hangs under, since the path above it is not drawn."""
    path, node = [], views[focus]
    while node.parent is not None:
        path.append(node)
        node = views[node.parent]
    prefix = clean(tt([t for v in reversed(path) for t in v.token_ids]))
    return (f"focused on node {focus}, prefix '{html_escape(shorten(prefix, 60))}' "
            f"({len(path)} level{'s' if len(path) != 1 else ''} below the root)")


def footer_notes(snapshot: CacheSnapshot, focus, views: dict, tt: TokenText, highlights: Highlights, shown,
                 labels_shown: bool) -> list[str]:
    """What the drawing cannot show: the focus prefix, nodes evicted this step, folded boxes, hidden labels."""
    footer = []
    if focus is not None and focus != snapshot.root_id:
        footer.append(focus_note(views, focus, tt))
    evicted = highlights.evicted_nodes
    if evicted:   # one note per node, so the footer can wrap between them instead of running off the edge
        gone = [f"node {nid} '{html_escape(shorten(clean(tt(toks)), 40))}' (slots {slot_runs(sl, max_runs=3)})"
                for nid, toks, sl in evicted[:3]]
        gone[0] = "evicted this step: " + gone[0]
        if len(evicted) > 3:
            gone[-1] += f" and {len(evicted) - 3} more"
        footer += [f"<span style='color:{VICTIM}'>{g}</span>" for g in gone]
    boxes = [n for n in shown.nodes if isinstance(n, tuple)]
    if boxes:
        n_hidden = sum(shown.nodes[n]["hidden"] for n in boxes)
        footer.append(f"{n_hidden:,} of {len(views):,} nodes folded into {len(boxes)} “+N” "
                      f"boxes: focus a node to open its subtree")
    if not labels_shown:
        footer.append("labels hidden at this size: hover a node, or focus a subtree")
    return footer


FOOTER_CHAR_PX = 6.6   # average width of one character of the footer's 12 px font
FOOTER_LINE_PX = 16


def footer_lines(footer: list[str], width: int) -> list[str]:
    """The notes joined with " · " into lines that fit `width` pixels (a note never splits; tags do
    not count), so a long eviction caption wraps instead of being cut at the figure's right edge."""
    chars = max(20, int((width - 20) / FOOTER_CHAR_PX))
    lines: list[str] = []
    visible = 0
    for note in footer:
        n = len(re.sub(r"<[^>]*>", "", note))
        if lines and visible + 3 + n <= chars:
            lines[-1] += " · " + note
            visible += 3 + n
        else:
            lines.append(note)
            visible = n
    return lines


def footer_annotation(lines: list[str]) -> dict:
    """The notes as grey lines under the plot."""
    return dict(xref="paper", yref="paper", x=0, y=0, xanchor="left", yanchor="top", yshift=-6,
                showarrow=False, align="left", font=dict(color="#4b5563", size=12), text="<br>".join(lines))
