"""What to colour in the tree: the nodes one step changed (`step_highlights`), the path one request
matched and inserted (`request_highlights`), and the nodes evicted in the last few tree-changing
steps, kept on screen as fading ghosts (`ghosts_from_events`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from core.cache.events import EventLike, ev_get, ev_kind
from core.observe.snapshot import CacheSnapshot, NodeView

TREE_KINDS = ("match", "split", "insert", "evict", "reset")
GHOST_STEPS = 3   # an evicted node stays drawn, fading, for this many tree-changing steps


@dataclass(frozen=True)
class Highlights:
    """Node ids that changed in "this step" (a window of events), for colouring."""
    inserted: frozenset = frozenset()
    matched: frozenset = frozenset()
    split: frozenset = frozenset()
    evicted: frozenset = frozenset()
    # (node id, token ids, slots) of each evicted node, to name it once it is gone from the tree
    evicted_nodes: tuple = ()


def step_highlights(events: Iterable[EventLike]) -> Highlights:
    """Highlights from the events of one step: inserts -> green, match paths -> blue, both halves of
    every split -> dashed, evicted nodes listed (and dropped from the other sets)."""
    inserted, matched, split, evicted = set(), set(), set(), set()
    evicted_nodes = []
    for e in events:
        kind = ev_kind(e)
        if kind == "insert":
            inserted.add(int(ev_get(e, "node")))
        elif kind == "match":
            matched.update(int(n) for n in (ev_get(e, "path") or ()))
        elif kind == "split":
            split.update((int(ev_get(e, "node")), int(ev_get(e, "new_parent"))))
        elif kind == "evict":
            nid = int(ev_get(e, "node"))
            evicted.add(nid)
            evicted_nodes.append((nid, tuple(ev_get(e, "token_ids") or ()), tuple(ev_get(e, "slots") or ())))
        elif kind == "reset":
            inserted, matched, split, evicted, evicted_nodes = set(), set(), set(), set(), []
    gone = frozenset(evicted)
    return Highlights(frozenset(inserted - gone), frozenset(matched - gone), frozenset(split - gone),
                      gone, tuple(evicted_nodes))


def node_state(node: NodeView, highlights: Optional[Highlights] = None) -> str:
    """Fill category of a node: root, inserted, matched, locked or cached (first that applies)."""
    if node.parent is None:
        return "root"
    h = highlights or Highlights()
    if node.id in h.inserted:
        return "inserted"
    if node.id in h.matched:
        return "matched"
    if node.lock_ref > 0:
        return "locked"
    return "cached"


@dataclass(frozen=True)
class Ghost:
    """An evicted node drawn where it was: `age` 0 = evicted by the latest tree-changing step."""
    id: int
    parent: int
    token_ids: tuple
    slots: tuple
    last_access_time: float
    evicted_at: float
    age: int

    def view(self) -> NodeView:
        return NodeView(id=self.id, parent=self.parent, token_ids=tuple(self.token_ids), slots=tuple(self.slots),
                        last_access_time=self.last_access_time, creation_time=self.last_access_time,
                        hit_count=0, lock_ref=0, priority=0, is_leaf=True, evictable=False)


def ghosts_from_events(events: Sequence[EventLike], steps: int = GHOST_STEPS,
                       painted_seq: Optional[int] = None) -> tuple[Ghost, ...]:
    """Nodes evicted during the last `steps` distinct times at which the tree changed (a decode
    step that only allocates does not age them), and, given `painted_seq` (the last event the
    previous drawing showed), every node evicted after it however many steps ran since: a page
    that draws once a second still shows each eviction. None from before the latest reset. Age 0
    is the latest tree-changing time; older ones fade, capped at `steps - 1`."""
    times: list = []
    fresh: set = set()    # times with an eviction the previous drawing did not show
    for e in events:
        kind = ev_kind(e)
        if kind in TREE_KINDS:
            t = ev_get(e, "time")
            if not times or times[-1] != t:
                times.append(t)
            if kind == "reset":
                times, fresh = [t], set()
            elif kind == "evict" and painted_seq is not None and int(ev_get(e, "seq")) > painted_seq:
                fresh.add(t)
    window = [t for i, t in enumerate(times) if i >= len(times) - steps or t in fresh]
    out = []
    after_reset = False
    for e in reversed(list(events)):
        kind = ev_kind(e)
        if kind == "reset":
            after_reset = True
        if after_reset or kind != "evict" or ev_get(e, "time") not in window:
            continue
        age = min(steps - 1, len(window) - 1 - window.index(ev_get(e, "time")))
        out.append(Ghost(int(ev_get(e, "node")), int(ev_get(e, "parent")), tuple(ev_get(e, "token_ids") or ()),
                         tuple(ev_get(e, "slots") or ()), float(ev_get(e, "last_access_time") or 0),
                         float(ev_get(e, "time")), age))
    return tuple(reversed(out))


def request_path(snapshot: CacheSnapshot, token_ids: Sequence[int],
                 extra_key: Optional[str] = None) -> list[NodeView]:
    """The nodes that hold a prefix of `token_ids`, root's child first (the walk match_prefix does,
    whole edges only: a node whose edge leaves the tokens ends the walk)."""
    children: dict = {}
    for n in snapshot.nodes:
        if n.parent is not None:
            children.setdefault(n.parent, []).append(n)
    path, at, node = [], 0, snapshot.root_id
    ids = [int(t) for t in token_ids]
    while at < len(ids):
        nxt = None
        for c in children.get(node, ()):
            k = len(c.token_ids)
            if k and tuple(ids[at:at + k]) == tuple(c.token_ids) and (node != snapshot.root_id
                                                                      or extra_key is None or c.extra_key == extra_key):
                nxt = c
                break
        if nxt is None:
            break
        path.append(nxt)
        at += len(nxt.token_ids)
        node = nxt.id
    return path


def request_highlights(snapshot: CacheSnapshot, token_ids: Sequence[int], cached_tokens: int) -> Highlights:
    """The path a request walks: nodes within its first `cached_tokens` tokens were matched
    (blue), the rest of the path was inserted by it (green)."""
    matched, inserted, at = set(), set(), 0
    for n in request_path(snapshot, token_ids):
        (matched if at < cached_tokens else inserted).add(n.id)
        at += len(n.token_ids)
    return Highlights(inserted=frozenset(inserted), matched=frozenset(matched))
