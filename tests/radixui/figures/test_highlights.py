"""What the tree colours (radixui.figures.highlights): one step's inserts, matches, splits and evictions,
a node's fill state, a request's path, and the ghosts of evicted nodes (their fading, and every eviction
since the last paint kept however many steps ran)."""
from core.cache.events import EvictEvent, InsertEvent, ResetEvent
from core.observe.snapshot import NodeView
from radixui.figures.highlights import (
    GHOST_STEPS,
    Highlights,
    ghosts_from_events,
    node_state,
    request_highlights,
    request_path,
    step_highlights,
)


def test_step_highlights_time_1_split_match_insert(walk):
    _, _, steps = walk
    h = step_highlights(steps[1].events)
    assert h.inserted == {3}
    assert h.matched == {2}
    assert h.split == {1, 2}          # both halves of the cut "Why my code throws errors" edge
    assert h.evicted == set() and h.evicted_nodes == ()


def test_step_highlights_time_3_eviction(walk):
    _, tok, steps = walk
    h = step_highlights(steps[3].events)
    assert h.inserted == {6} and h.matched == {2, 4} and h.split == set()
    assert h.evicted == {3}
    (nid, toks, slots), = h.evicted_nodes
    assert nid == 3 and tok.token_text(toks) == "GPU memory runs out" and slots == (6, 7, 8, 9)


def test_step_highlights_accepts_event_dicts(walk):
    _, _, steps = walk
    assert step_highlights([e.to_dict() for e in steps[2].events]) == step_highlights(steps[2].events)


def test_reset_clears_highlights(walk):
    _, _, steps = walk
    assert step_highlights(list(steps[1].events) + [ResetEvent(seq=99, time=2)]) == Highlights()


def test_node_state_priority():
    v = NodeView(id=1, parent=0, token_ids=(1,), slots=(1,), last_access_time=0, creation_time=0, hit_count=0,
                 lock_ref=1, priority=0, is_leaf=True, evictable=False)
    assert node_state(v) == "locked"
    assert node_state(v, Highlights(matched=frozenset({1}))) == "matched"
    assert node_state(v, Highlights(inserted=frozenset({1}), matched=frozenset({1}))) == "inserted"


def test_ghosts_fade_over_tree_steps_and_vanish():
    ev = [EvictEvent(seq=1, time=1, node=5, parent=0, token_ids=(1,), slots=(3,), last_access_time=0,
                     policy_key=(0,))]
    later = [InsertEvent(seq=1 + i, time=1 + i, node=10 + i, parent=0, token_ids=(9,), slots=(4,))
             for i in range(1, GHOST_STEPS + 1)]
    assert [g.age for g in ghosts_from_events(ev + later[:1])] == [1]
    assert [g.age for g in ghosts_from_events(ev + later[:GHOST_STEPS - 1])] == [GHOST_STEPS - 1]
    assert ghosts_from_events(ev + later) == ()
    assert ghosts_from_events(ev + [ResetEvent(seq=9, time=1)]) == ()


def test_request_path_is_matched_then_inserted(walk):
    _, tok, steps = walk
    snap = steps[3].snapshot
    ids = tok.encode("Why my code won't compile")
    assert [n.id for n in request_path(snap, ids)] == [2, 4, 6]
    h = request_highlights(snap, ids, cached_tokens=3)
    assert h.matched == {2, 4} and h.inserted == {6}
    h = request_highlights(snap, tok.encode("Why my code is slow"), cached_tokens=0)
    assert h.matched == set() and h.inserted == {2, 4, 5}
    assert request_path(snap, tok.encode("Unseen words")) == []


def test_every_eviction_since_the_last_paint_stays_a_ghost_however_many_steps_ran():
    """Twelve steps each evicting one node between two paints: without `painted_seq` only the last
    GHOST_STEPS are ghosts; with the seq the previous paint showed, all twelve are, the newest at age
    0 and the older ones at the faintest age; evictions the previous paint showed keep the window's rule."""
    ev = [EvictEvent(seq=i, time=i, node=100 + i, parent=0, token_ids=(i,), slots=(i,), last_access_time=0,
                     policy_key=(0,)) for i in range(1, 13)]
    assert [g.id for g in ghosts_from_events(ev)] == [110, 111, 112]
    ghosts = ghosts_from_events(ev, painted_seq=0)
    assert [g.id for g in ghosts] == list(range(101, 113))
    assert [g.age for g in ghosts] == [GHOST_STEPS - 1] * 10 + [1, 0]
    assert [g.id for g in ghosts_from_events(ev, painted_seq=8)] == [109, 110, 111, 112]
    assert [g.id for g in ghosts_from_events(ev, painted_seq=12)] == [110, 111, 112]
