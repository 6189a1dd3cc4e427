import pytest

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache
from core.observe.snapshot import snapshot_cache
from radixui.figures.heap import (
    COLUMNS,
    LATER_COLOUR,
    LEAF_COLOUR,
    eviction_figure,
    eviction_table,
    order_note,
    policy_key,
)
from radixui.figures.plot import validate
from tests.article_cache import run_request


def test_eviction_table_at_time_2(walk):
    _, tok, steps = walk
    df = eviction_table(steps[2].snapshot, tok.token_text)
    assert list(df.columns) == COLUMNS
    assert df["node"].tolist() == [3, 1, 5, 4, 2]
    first = df.iloc[0]
    assert first["order"] == 1 and first["last_access_time"] == 1 and first["policy_key"] == (1.0,)
    assert first["text"] == "GPU memory runs out" and first["slots"] == "6–9" and first["tokens"] == 4
    assert df["leaf_now"].tolist() == [True, True, True, False, False]
    assert df["freed_total"].tolist() == [4, 6, 8, 10, 11]
    assert df["text"].tolist()[3:] == ["my code", "Why"]


def test_eviction_table_limit_and_empty(walk):
    _, tok, steps = walk
    assert eviction_table(steps[3].snapshot, tok.token_text, limit=2)["node"].tolist() == [1, 5]
    from core.observe.time_travel import empty_snapshot
    assert eviction_table(empty_snapshot(4)).empty


def test_policy_keys_follow_the_policy():
    cache = RadixCache(SlotAllocator(32), eviction_policy="lfu")
    run_request(cache, [1, 2, 3])
    cache.tick()
    run_request(cache, [1, 2, 3, 4])      # hits node 1 (2 requests now), adds node 2 under it (1 request)
    snap = snapshot_cache(cache)
    df = eviction_table(snap)
    row = df.iloc[0]
    assert row["policy_key"] == (1.0, 1.0)  # (hit_count, last_access_time)
    assert snap.node(1).hit_count == 2
    n = snap.node(int(row["node"]))
    assert policy_key(n, "fifo") == (n.creation_time,)
    assert policy_key(n, "no-such-policy") is None


def test_eviction_figure_bars(walk):
    _, tok, steps = walk
    fig = eviction_figure(steps[2].snapshot, tok.token_text)
    validate(fig)
    bar = fig.data[0]
    assert list(bar.x) == [4, 2, 2, 2, 1]
    assert bar.y[0] == "#1 node 3 · GPU memory runs out"
    assert list(bar.marker.color) == [LEAF_COLOUR] * 3 + [LATER_COLOUR] * 2
    assert fig.layout.yaxis.autorange == "reversed"   # next victim on top


def test_eviction_figure_empty_says_why():
    from core.observe.time_travel import empty_snapshot
    fig = eviction_figure(empty_snapshot(4))
    validate(fig)
    assert "nothing evictable" in fig.layout.annotations[0].text


STATEFUL_RUN = ([1, 2], [5, 6, 7], [1, 2], [1, 2], [9, 9, 9, 9], [5, 6, 7])


@pytest.mark.parametrize("policy", ["arc", "lecar", "gdsf"])
def test_a_stateful_policy_shows_its_own_order_and_no_stand_in_key(policy):
    """These three order this run differently from LRU: the table must follow the cache's own
    eviction_order (the policy object's key), and not print the LRU stand-in as its key."""
    cache = RadixCache(SlotAllocator(64), eviction_policy=policy)
    for ids in STATEFUL_RUN:
        cache.tick()
        run_request(cache, list(ids))
    snap = snapshot_cache(cache)
    real = [n.id for n in cache.eviction_order()]
    lru = [i for _, i in sorted((n.last_access_time, n.id) for n in snap.nodes if n.evictable)]
    assert real != lru
    df = eviction_table(snap)
    assert df["node"].tolist() == real
    assert df["policy_key"].isna().all()
    assert "key None" not in " ".join(eviction_figure(snap).data[0].hovertext)
    note = order_note(policy)
    assert f"Policy `{policy}` keeps state of its own" in note and "eviction_order()" in note
    assert order_note("lru") == "Policy `lru`: the order evict() would take nodes, next victim first."


def test_time_travel_says_a_stateful_policys_past_victim_is_an_approximation():
    from core.observe.time_travel import empty_snapshot, replay, replay_note
    cache = RadixCache(SlotAllocator(64), eviction_policy="arc")
    for ids in STATEFUL_RUN:
        cache.tick()
        run_request(cache, list(ids))
    past = replay(empty_snapshot(64, policy="arc"), list(cache.events))
    assert past.eviction_order != tuple(n.id for n in cache.eviction_order())   # why the note is owed
    assert "LRU order, an approximation" in replay_note("arc")
    assert replay_note("lru") is None and replay_note("slru") is None
