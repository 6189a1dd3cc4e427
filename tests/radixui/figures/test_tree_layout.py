"""The tree's layout (radixui/figures/tree_layout.py tidy_layout): centred over children, a column apart, never crossing."""
import itertools

import networkx as nx
import numpy as np
import pytest

from benchmarks.bench_ui import build_tree
from core.observe.snapshot import snapshot_cache
from radixui.figures.tree_layout import snapshot_graph, tidy_layout


def random_tree(n, seed, max_children=4):
    rng = np.random.default_rng(seed)
    g = nx.DiGraph(root=0)
    g.add_node(0)
    for i in range(1, n):
        parents = [p for p in g.nodes if g.out_degree(p) < max_children]
        g.add_edge(int(rng.choice(parents)), i)
    return g


def crosses(a, b, c, d):
    def orient(p, q, r):
        v = (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
        return 0 if abs(v) < 1e-9 else (1 if v > 0 else -1)
    if len({a, b, c, d}) < 4:
        return False  # edges sharing an endpoint meet there, they do not cross
    o1, o2, o3, o4 = orient(a, b, c), orient(a, b, d), orient(c, d, a), orient(c, d, b)
    return o1 * o2 < 0 and o3 * o4 < 0


@pytest.mark.parametrize("seed", range(6))
def test_tidy_layout_centred_separated_and_planar(seed):
    g = random_tree(40, seed)
    pos = tidy_layout(g, 0)
    depth = nx.shortest_path_length(g, 0)
    for n, (x, y) in pos.items():
        assert y == -depth[n]
        kids = list(g.successors(n))
        if kids:
            assert x == pytest.approx((pos[kids[0]][0] + pos[kids[-1]][0]) / 2)     # centred over children
            xs = [pos[k][0] for k in kids]
            assert xs == sorted(xs)                                                   # children in order
    levels = {}
    for n, (x, y) in pos.items():
        levels.setdefault(y, []).append(x)
    for xs in levels.values():
        xs.sort()
        assert all(b - a >= 1 - 1e-9 for a, b in zip(xs, xs[1:]))                   # a column apart
    segs = [(pos[u], pos[v]) for u, v in g.edges]
    for (a, b), (c, d) in itertools.combinations(segs, 2):
        assert not crosses(a, b, c, d)
    assert min(x for x, _ in pos.values()) == 0


def test_tidy_layout_deep_chain_is_iterative():
    g = nx.DiGraph(root=0)
    nx.add_path(g, range(5000))
    pos = tidy_layout(g)
    assert pos[4999] == (0.0, -4999.0)


def test_figure_edges_never_cross_on_a_real_tree():
    snap = snapshot_cache(build_tree(60, seed=1))
    g = snapshot_graph(snap)
    pos = tidy_layout(g)
    segs = [(pos[u], pos[v]) for u, v in g.edges]
    for (a, b), (c, d) in itertools.combinations(segs, 2):
        assert not crosses(a, b, c, d)
