"""The radix tree figure: colours, rings, the victim mark, ghosts, folding of big trees into "+N" boxes,
focus, the overview, and the footer under the tree (what it colours: test_highlights.py)."""
import networkx as nx
import numpy as np
import pytest

from benchmarks.bench_ui import build_tree, token_text
from core.observe.snapshot import snapshot_cache
from radixui.figures.plot import validate
from radixui.figures.tree import (
    EVICTABLE_OUTLINE,
    FILL,
    LEGEND_NAMES,
    OUTLINE,
    Highlights,
    step_highlights,
    tree_figure,
    tree_overview,
)
from radixui.figures.tree_layout import snapshot_graph, visible_tree
from tests.article_cache import run_request


def trace(fig, name):
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, f"expected one trace named {name!r}, got {[t.name for t in fig.data]}"
    return found[0]


def node_traces(fig):
    names = set(LEGEND_NAMES.values()) | {"root"}
    return [t for t in fig.data if t.name in names and t.customdata is not None]


def nodes_by_id(fig):
    """node id -> (trace name, x, y, outline colour, outline width)."""
    out = {}
    for t in node_traces(fig):
        lc, lw = t.marker.line.color, t.marker.line.width
        for i, nid in enumerate(t.customdata):
            out[nid] = (t.name, t.x[i], t.y[i], lc[i] if not isinstance(lc, str) else lc,
                        lw[i] if not isinstance(lw, (int, float)) else lw)
    return out


def line_segments(fig):
    t = trace(fig, "edges")
    xs, ys = np.asarray(t.x, dtype=float), np.asarray(t.y, dtype=float)
    return int(np.isnan(xs).sum()), xs, ys


# ----- graph ---------------------------------------------------------------------------------
def test_snapshot_graph_counts_and_attributes(walk):
    _, tok, steps = walk
    g = snapshot_graph(steps[2].snapshot)
    assert g.number_of_nodes() == 6 and g.number_of_edges() == 5
    assert nx.is_arborescence(g)
    assert g.graph["root"] == 0
    assert sorted(g.successors(2)) == [3, 4] and sorted(g.successors(4)) == [1, 5]
    assert tok.token_text(g.nodes[3]["view"].token_ids) == "GPU memory runs out"


# ----- the figure at time 2 (the article's tree) --------------------------------------------------
@pytest.fixture(scope="module")
def fig2(walk):
    _, tok, steps = walk
    return tree_figure(steps[2].snapshot, tok.token_text, step_highlights(steps[2].events))


def test_figure_is_valid_plotly(fig2):
    """Every trace survives plotly's full validation unchanged: same types, names and points."""
    checked = validate(fig2)
    assert [(t.type, t.name) for t in checked.data] == [(t.type, t.name) for t in fig2.data]
    assert checked.to_dict() == fig2.to_dict()
    assert checked.layout.height == fig2.layout.height and checked.layout.meta == fig2.layout.meta


def test_node_and_edge_counts(fig2):
    assert len(nodes_by_id(fig2)) == 6
    n_edges, _, _ = line_segments(fig2)
    assert n_edges == 5
    assert len(trace(fig2, "edge text").text) == 5


def test_edge_labels_are_the_decoded_runs(fig2):
    assert sorted(trace(fig2, "edge text").text) == sorted(
        ["Why", "my code", "throws errors", "is slow", "GPU memory runs out"])


def test_node_labels_are_compressed_slot_runs(fig2):
    assert sorted(trace(fig2, "slots").text) == sorted(["1", "2–3", "4–5", "10–11", "6–9"])


def test_colours_per_state(fig2):
    nodes = nodes_by_id(fig2)
    assert nodes["5"][0] == LEGEND_NAMES["inserted"]            # "is slow": inserted this step
    assert nodes["2"][0] == nodes["4"][0] == LEGEND_NAMES["matched"]
    assert nodes["1"][0] == nodes["3"][0] == LEGEND_NAMES["cached"]
    assert nodes["0"][0] == "root"
    fills = {t.name: t.marker.color for t in node_traces(fig2)}
    assert fills[LEGEND_NAMES["inserted"]] == FILL["inserted"]
    assert fills[LEGEND_NAMES["matched"]] == FILL["matched"]
    # red outline on the evictable leaves only
    for nid in ("1", "3", "5"):
        assert nodes[nid][3] == EVICTABLE_OUTLINE
    for nid in ("2", "4"):
        assert nodes[nid][3] == OUTLINE


def test_split_nodes_get_dashed_rings(fig2):
    nodes = nodes_by_id(fig2)
    rings = [s for s in fig2.layout.shapes if s.line.dash == "dash"]
    assert {(s.xanchor, s.yanchor) for s in rings} == {nodes["4"][1:3], nodes["1"][1:3]}


def test_victim_mark_on_gpu_memory_runs_out_at_time_2(fig2):
    nodes = nodes_by_id(fig2)
    x, y = nodes["3"][1:3]
    mark = [a for a in fig2.layout.annotations if a.text == "next victim"]
    assert len(mark) == 1 and (mark[0].x, mark[0].y) == (x, y)
    crosses = [t for t in fig2.data if t.marker is not None and t.marker.symbol == "x-thin" and t.x[0] is not None]
    assert len(crosses) == 1 and (crosses[0].x[0], crosses[0].y[0]) == (x, y)


def test_one_legend_with_every_colour(fig2):
    legend = [t.name for t in fig2.data if t.showlegend]
    assert legend == [LEGEND_NAMES[s] for s in ("inserted", "matched", "locked", "cached")] + [
        "evictable leaf", "just split", "next victim"]


def test_hover_has_text_slots_time_lock_and_hits(fig2):
    nodes_hover = {}
    for t in node_traces(fig2):
        for nid, h in zip(t.customdata, t.hovertext):
            nodes_hover[nid] = h
    h = nodes_hover["3"]
    for part in ("node 3", "GPU memory runs out", "slots: 6–9", "last_access_time: 1", "lock_ref: 0",
                 "hit_count: 1", "next eviction victim"):
        assert part in h


def test_time_3_names_the_evicted_node(walk):
    _, tok, steps = walk
    fig = tree_figure(steps[3].snapshot, tok.token_text, step_highlights(steps[3].events))
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "evicted this step: node 3 'GPU memory runs out' (slots 6–9)" in notes
    nodes = nodes_by_id(fig)
    assert "3" not in nodes and nodes["6"][0] == LEGEND_NAMES["inserted"]
    # next victim at time 3: "throws errors" (time 2, lowest id among the time-2 leaves)
    mark = [a for a in fig.layout.annotations if a.text == "next victim"][0]
    assert (mark.x, mark.y) == nodes["1"][1:3]


def test_locked_nodes_are_grey(walk):
    from core.cache.allocator import SlotAllocator
    from core.cache.radix_cache import RadixCache, RadixKey
    cache = RadixCache(SlotAllocator(16))
    ids = [1, 2, 3]
    run_request(cache, ids)
    m = cache.match_prefix(RadixKey(ids))
    cache.inc_lock_ref(m.last_node)          # a running request holds the path
    fig = tree_figure(snapshot_cache(cache))
    nodes = nodes_by_id(fig)
    assert nodes[str(m.last_node.id)][0] == LEGEND_NAMES["locked"]
    assert nodes[str(m.last_node.id)][3] == OUTLINE  # a locked leaf is not evictable


# ----- large trees: budget, "+N", focus, overview --------------------------------------------------
@pytest.fixture(scope="module")
def big():
    return snapshot_cache(build_tree(2000)), token_text


def test_visible_tree_folds_into_plus_n(big):
    snap, _ = big
    g = snapshot_graph(snap)
    disp = visible_tree(g, budget=150, max_depth=None)
    real = [n for n in disp if not isinstance(n, tuple)]
    boxes = [n for n in disp if isinstance(n, tuple)]
    assert len(real) == 150 and boxes
    assert len(real) + sum(disp.nodes[b]["hidden"] for b in boxes) == g.number_of_nodes()
    assert sum(disp.nodes[b]["tokens"] for b in boxes) + sum(len(disp.nodes[n]["view"].token_ids) for n in real) \
        == sum(len(n.token_ids) for n in snap.nodes)
    assert nx.is_arborescence(disp)


def test_visible_tree_keeps_highlighted_deep_nodes(big):
    snap, _ = big
    g = snapshot_graph(snap)
    deepest = max(g.nodes, key=lambda n: nx.shortest_path_length(g, 0, n))
    disp = visible_tree(g, budget=10, keep=[deepest], max_depth=3)
    assert deepest in disp and nx.has_path(disp, 0, deepest)


def test_big_tree_figure_is_bounded(big):
    """The drawn size is bounded (the build time is benchmarks/bench_ui.py's to measure)."""
    snap, tt = big
    h = Highlights(inserted=frozenset({snap.nodes[-1].id}))
    fig = tree_figure(snap, tt, h)
    validate(fig)
    nodes = nodes_by_id(fig)
    assert str(snap.nodes[-1].id) in nodes
    real = [k for k in nodes if not k.startswith("+")]
    assert len(snap.nodes) >= 2000 and len(real) <= 150
    assert sum(len(t.x) for t in fig.data if t.name == "edges") <= 5 * len(nodes)   # 5 points an edge
    assert any(k.startswith("+") for k in nodes)
    assert "folded" in " ".join(a.text for a in fig.layout.annotations)
    assert fig.layout.meta["chars"] >= 6           # columns stay wide enough for labels


def test_focus_draws_one_subtree(walk):
    _, tok, steps = walk
    fig = tree_figure(steps[2].snapshot, tok.token_text, focus=4)
    assert set(nodes_by_id(fig)) == {"4", "1", "5"}
    assert "focused on node 4, prefix 'Why my code' (2 levels below the root)" in fig.layout.annotations[-1].text
    with pytest.raises(ValueError, match="not in the tree"):
        tree_figure(steps[2].snapshot, focus=42)


def test_overview_sizes_boxes_by_subtree_tokens(walk):
    _, tok, steps = walk
    fig = tree_overview(steps[2].snapshot, tok.token_text)
    validate(fig)
    t = fig.data[0]
    values = dict(zip(t.ids, t.values))
    assert values == {"0": 11, "2": 11, "4": 6, "1": 2, "5": 2, "3": 4}
    parents = dict(zip(t.ids, t.parents))
    assert parents == {"0": "", "2": "0", "4": "2", "1": "4", "5": "4", "3": "2"}
    assert dict(zip(t.ids, t.labels))["3"] == "#3 GPU memory runs out"
    assert dict(zip(t.ids, t.text))["4"] == "6 tok"
    assert t.type == "treemap"
    assert validate(tree_overview(steps[2].snapshot, kind="icicle")).data[0].type == "icicle"
    with pytest.raises(ValueError):
        tree_overview(steps[2].snapshot, kind="pie")


def test_empty_tree_draws_the_root_alone():
    from core.observe.time_travel import empty_snapshot
    fig = tree_figure(empty_snapshot(8))
    validate(fig)
    assert set(nodes_by_id(fig)) == {"0"}


# ----- issue 11: readable overview, whole words, ids in circles, ghosts, request paths ---------------
def _luminance(hex_colour: str) -> float:
    def ch(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * ch(r) + 0.7152 * ch(g) + 0.0722 * ch(b)


def test_overview_text_is_dark_on_pale_boxes(walk):
    _, tok, steps = walk
    t = tree_overview(steps[3].snapshot, tok.token_text, step_highlights(steps[3].events)).data[0]
    text = t.insidetextfont.color
    assert t.textfont.color == text == "#111827"
    for fill in set(t.marker.colors):
        hi, lo = sorted((_luminance(fill), _luminance(text)), reverse=True)
        assert (hi + 0.05) / (lo + 0.05) >= 4.5, fill     # WCAG AA for normal text


def test_node_ids_are_printed_in_their_circles(fig2):
    ids = trace(fig2, "node ids")
    nodes = nodes_by_id(fig2)
    assert sorted(ids.text) == sorted(k for k in nodes if k != "0")
    for nid, x, y in zip(ids.text, ids.x, ids.y):
        assert (x, y) == nodes[nid][1:3]


def test_evicted_node_stays_as_a_ghost_with_its_slots(walk):
    from radixui.figures.highlights import ghosts_from_events
    _, tok, steps = walk
    events = [e for s in steps for e in s.events]
    ghosts = ghosts_from_events(events)
    assert [(g.id, g.parent, g.slots, g.age) for g in ghosts] == [(3, 2, (6, 7, 8, 9), 0)]
    fig = tree_figure(steps[3].snapshot, tok.token_text, step_highlights(steps[3].events), ghosts=ghosts)
    nodes = nodes_by_id(fig)
    assert nodes["3"][0] == LEGEND_NAMES["evicted"]
    assert nodes["3"][2] == nodes["2"][2] - 1          # drawn where it was: a child of node 2
    t = trace(fig, "slots")
    slots = dict(zip(zip(t.x, t.y), t.text))
    assert slots[nodes["3"][1:3]] == "<s>6–9</s>"
    assert len(trace(fig, "ghost edges").x) == 5
    assert trace(fig, LEGEND_NAMES["evicted"]).marker.opacity[0] == 0.95
    # without ghosts the node is simply gone
    assert "3" not in nodes_by_id(tree_figure(steps[3].snapshot, tok.token_text))


def test_a_long_eviction_caption_wraps_under_the_tree_instead_of_leaving_the_figure(walk):
    """Three evicted nodes with long texts: the footer breaks between nodes into lines that
    each fit the width (700 px), and the bottom margin grows by one line per extra line."""
    import re

    from core.cache.events import EvictEvent
    from radixui.figures.tree_text import FOOTER_CHAR_PX, FOOTER_LINE_PX, footer_lines
    _, tok, steps = walk
    snap = steps[3].snapshot
    long = tuple(t for n in snap.nodes for t in n.token_ids) * 3
    events = [EvictEvent(seq=90 + i, time=9, node=50 + i, parent=0, token_ids=long, slots=(i,), last_access_time=0,
                         policy_key=(0,)) for i in range(3)]
    one_line = tree_figure(snap, tok.token_text, width=700)
    fig = tree_figure(snap, tok.token_text, step_highlights(events), width=700)
    footer = [a for a in fig.layout.annotations if "evicted this step" in a.text][0].text.split("<br>")
    assert len(footer) == 3 and footer[0].count("node 5") == 1
    for line in footer:
        assert len(re.sub(r"<[^>]*>", "", line)) * FOOTER_CHAR_PX <= 700 - 20
    assert fig.layout.margin.b == one_line.layout.margin.b + 2 * FOOTER_LINE_PX
    assert fig.layout.height == one_line.layout.height + 2 * FOOTER_LINE_PX
    assert footer_lines(["a" * 10, "b" * 10], 1000) == ["a" * 10 + " · " + "b" * 10]


def test_a_ghost_under_the_next_victim_starts_below_its_note(walk):
    """The victim's only children are ghosts; their dotted stroke starts under the "next victim" note
    (it used to run through it)."""
    from radixui.figures.highlights import Ghost
    from radixui.figures.tree_marks import LABEL_RADIUS_PX
    _, tok, steps = walk
    snap = steps[3].snapshot
    victim = snap.eviction_order[0]
    ghost = Ghost(id=99, parent=victim, token_ids=(5,), slots=(10,), last_access_time=0, evicted_at=3, age=0)
    fig = tree_figure(snap, tok.token_text, ghosts=(ghost,))
    note = [a for a in fig.layout.annotations if a.text == "next victim"][0]
    font = fig.data[[t.name for t in fig.data].index("edge text")].textfont.size
    span = fig.layout.yaxis.range[1] - fig.layout.yaxis.range[0]
    per_px = span / (fig.layout.height - fig.layout.margin.t - fig.layout.margin.b)
    note_bottom = note.y - (LABEL_RADIUS_PX + 1.25 * font + 6 + 1.25 * font) * per_px
    stroke = trace(fig, "ghost edges")
    assert stroke.x[0] == note.x and stroke.y[0] <= note_bottom, (stroke.y[0], note_bottom)


def _deep_chain(depth: int):
    """A chain `depth` levels deep with a one-page sibling at every level (a long chat, turn by turn)."""
    from core.cache.allocator import SlotAllocator
    from core.cache.radix_cache import RadixCache
    cache = RadixCache(SlotAllocator(4096))
    seq: list[int] = []
    for d in range(depth):
        seq = seq + [200 + d * 10 + j for j in range(6)]
        run_request(cache, seq)
        run_request(cache, seq + [900 + d])
    return snapshot_cache(cache)


def test_a_tree_squeezed_into_the_live_page_keeps_every_bar_between_a_circle_and_a_label():
    """Ten levels in the Live page's 580 px left 42 px a level: two-line labels ran through the bars and the
    slot labels under the deepest nodes were cut off. A tight frame gives one-line labels, slots beside each
    node, and bars in the gap between a parent's circle and its children's labels."""
    snap = _deep_chain(10)
    loose = tree_figure(snap, width=900)
    assert loose.layout.height > 580 and trace(loose, "slots").textposition == "bottom center"
    fig = tree_figure(snap, width=900, height=580)
    assert trace(fig, "slots").textposition == "middle right"
    assert all("<br>" not in t for t in trace(fig, "edge text").text)
    assert not [a for a in fig.layout.annotations if a.text == "next victim"]     # the legend's ✕ names it
    _, xs, ys = line_segments(fig)
    plot_px = 580 - fig.layout.margin.t - fig.layout.margin.b
    u = (-fig.layout.yaxis.range[0] + fig.layout.yaxis.range[1] - 1) / plot_px   # data units per pixel
    font_px = 1.25 * trace(fig, "edge text").textfont.size
    for i in range(0, len(ys), 5):          # each elbow: parent stub top, bar, bar, child stub bottom, gap
        top, bar, bottom = ys[i], ys[i + 1], ys[i + 3]
        py = round(top)                      # levels sit on whole numbers: the parent's, and the child's under it
        cy = py - 1
        assert (py - top) / u >= 10          # the stroke starts under the parent's circle (20 px)
        assert top > bar > bottom            # the bar in the gap
        assert (bottom - cy) / u >= 11 + font_px   # and the stroke stops above the child's one-line label
    validate(fig)
