"""Tree layout: snapshot -> networkx DiGraph -> the display tree (folded to a budget) -> (x, y).

`tidy_layout` is Reingold–Tilford style: each subtree is laid out on its own, siblings are pushed
right until their contours are a column apart on every level they share, and each parent sits
centred between its first and last child, root at the top. Edges never cross and nodes on one
level are at least one column apart, so a label narrower than a column never overlaps another.

`visible_tree` folds a big tree for drawing: the biggest subtrees are expanded first until the
node budget or the depth limit, nodes that must stay visible (this step's changes, the next
victim) are kept with their path, and each parent's hidden children become one "+N" node.
"""
from __future__ import annotations

import heapq
from typing import Iterable, Optional

import networkx as nx

from core.observe.snapshot import CacheSnapshot

NODE_BUDGET = 150  # real nodes drawn before small subtrees fold into "+N"
MAX_DEPTH = 12     # levels drawn below the root (or the focused node) before deeper ones fold


def snapshot_graph(snapshot: CacheSnapshot) -> nx.DiGraph:
    """The whole tree as a DiGraph parent -> child; node attribute `view` holds the NodeView.

    Children keep the cache's order (snapshot nodes are parents-first, depth-first)."""
    g = nx.DiGraph(root=snapshot.root_id)
    for n in snapshot.nodes:
        g.add_node(n.id, view=n)
    g.add_edges_from([(n.parent, n.id) for n in snapshot.nodes if n.parent is not None])
    return g


def _preorder(succ, root) -> list:
    out, stack = [], [root]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(list(succ[n])))
    return out


def tidy_layout(graph: nx.DiGraph, root=None, sep: float = 1.0) -> dict:
    """(x, y) per node of a tree, Reingold–Tilford style: root at the top (y = -depth), each subtree
    laid out on its own, siblings pushed right until their contours are `sep` apart on every level
    they share, every parent centred between its first and last child; x starts at 0.

    Same-level nodes end up at least `sep` apart, so labels narrower than a column never overlap,
    and edges never cross. Iterative, so chains thousands deep are fine."""
    root = graph.graph.get("root") if root is None else root
    succ = graph.succ
    order = _preorder(succ, root)
    rel: dict = {}
    contour: dict = {}  # node -> (left x per level below it, right x per level), relative to the node
    for n in reversed(order):
        kids = list(succ[n])
        if not kids:
            contour[n] = ([0.0], [0.0])
            continue
        left, right = contour.pop(kids[0])
        left, right = list(left), list(right)
        offsets = [0.0]
        for k in kids[1:]:
            kl, kr = contour.pop(k)
            m = min(len(right), len(kl))
            shift = max(right[i] - kl[i] for i in range(m)) + sep
            offsets.append(shift)
            right = [x + shift for x in kr] + right[len(kr):]
            left = left + [x + shift for x in kl[len(left):]]
        mid = (offsets[0] + offsets[-1]) / 2.0
        for k, off in zip(kids, offsets):
            rel[k] = off - mid
        contour[n] = ([0.0] + [x - mid for x in left], [0.0] + [x - mid for x in right])
    pos = {root: (0.0, 0.0)}
    for n in order:
        x, y = pos[n]
        for k in succ[n]:
            pos[k] = (x + rel[k], y - 1.0)
    x0 = min(x for x, _ in pos.values())
    return {n: (x - x0, y) for n, (x, y) in pos.items()}


def visible_tree(graph: nx.DiGraph, root=None, budget: int = NODE_BUDGET, keep: Iterable = (),
                 max_depth: Optional[int] = MAX_DEPTH) -> nx.DiGraph:
    """The display tree under `root`: at most ~`budget` real nodes and `max_depth` levels, biggest
    subtrees expanded first; every node in `keep` and its path up to `root` shown regardless.
    Each parent's hidden children become one "+N" node, id ("more", parent), with attributes
    hidden (nodes), tokens and subtrees."""
    root = graph.graph.get("root") if root is None else root
    children = {n: list(graph.succ[n]) for n in graph}
    views = {n: graph.nodes[n]["view"] for n in graph}
    return Folding(children, views, root, max_depth).display(budget, keep)


class Folding:
    """The subtree under `root` with what folding needs, computed once for several budgets."""

    def __init__(self, children: dict, views: dict, root, max_depth: Optional[int]) -> None:
        self.children, self.views, self.root, self.max_depth = children, views, root, max_depth
        self.order = _preorder(children, root)
        depth = {root: 0}
        for n in self.order[1:]:
            depth[n] = depth[views[n].parent] + 1
        self.depth = depth
        self.too_deep = max_depth is not None and max(depth.values()) > max_depth
        count = dict.fromkeys(self.order, 1)
        tokens = {n: len(views[n].token_ids) for n in self.order}
        for n in reversed(self.order[1:]):
            p = views[n].parent
            count[p] += count[n]
            tokens[p] += tokens[n]
        self.count, self.tokens = count, tokens

    def __len__(self) -> int:
        return len(self.order)

    def display(self, budget: int, keep: Iterable = ()) -> nx.DiGraph:
        children, views, depth, count = self.children, self.views, self.depth, self.count
        if len(self.order) <= budget and not self.too_deep:
            shown = set(self.order)
        else:
            shown = {self.root}
            for k in keep:
                while k in depth and k not in shown:
                    shown.add(k)
                    k = views[k].parent
            heap = [(-count[c], c) for s_ in shown for c in children[s_] if c not in shown]
            heapq.heapify(heap)
            while heap and len(shown) < budget:
                _, n = heapq.heappop(heap)
                if n in shown or (self.max_depth is not None and depth[n] > self.max_depth):
                    continue
                shown.add(n)
                for c in children[n]:
                    if c not in shown:
                        heapq.heappush(heap, (-count[c], c))
        disp = nx.DiGraph(root=self.root)
        for n in self.order:  # depth-first: keeps the children's order
            if n in shown:
                disp.add_node(n, view=views[n])
                if n != self.root:
                    disp.add_edge(views[n].parent, n)
                hidden = [c for c in children[n] if c not in shown]
                if hidden:
                    disp.add_node(("more", n), hidden=sum(count[c] for c in hidden),
                                  tokens=sum(self.tokens[c] for c in hidden), subtrees=len(hidden))
                    disp.add_edge(n, ("more", n))
        return disp
