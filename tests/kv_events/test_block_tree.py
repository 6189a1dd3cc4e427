"""The rebuilt block tree on its own: chains, tiers, orphans and their adoption, re-announced blocks,
unknown removals, and the figures the page shows (depth, sharing, rates) on a tree small enough to count."""
from __future__ import annotations

from core.kv_events.block_tree import BlockTree
from core.kv_events.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from core.kv_events.view import block_snapshot


def _b(ts, *events):
    return KVEventBatch(ts, list(events), 0)


def stored(hashes, parent, tokens, medium="GPU", bs=2):
    return BlockStored(hashes, parent, tokens, bs, None, medium)


def test_chains_tiers_and_figures():
    t = BlockTree()
    t.apply(_b(10.0, stored([1, 2, 3], None, [1, 1, 2, 2, 3, 3]), stored([4], 1, [4, 4]), stored([5], 1, [5, 5])), 0)
    assert t.prefixes() == {(1, 1): 1, (1, 1, 2, 2): 1, (1, 1, 2, 2, 3, 3): 1, (1, 1, 4, 4): 1, (1, 1, 5, 5): 1}
    st = t.stats()
    # leaves 3 (depth 3), 4 and 5 (depth 2): 7 blocks' worth of sequences held in 5 blocks
    assert (st["blocks"], st["leaves"], st["max_depth"], st["branch_blocks"]) == (5, 3, 3, 1)
    assert abs(st["sharing"] - 7 / 5) < 1e-12
    t.apply(_b(11.0, stored([2], 1, [2, 2], medium="CPU_PINNED")), 1)     # a host copy: same block, 2 tiers
    assert t.media_counts() == {"CPU": 1, "GPU": 5} and t.blocks[(0, 2)].restores == 1
    t.apply(_b(12.0, BlockRemoved([2], "GPU")), 2)                          # still on the host: stays
    assert (0, 2) in t.blocks and t.blocks[(0, 2)].media == {"CPU"}
    t.apply(_b(13.0, BlockRemoved([2], "CPU_PINNED"), BlockRemoved([99], "GPU")), 3)
    assert (0, 2) not in t.blocks and t.orphans == {(0, 3)} and t.unknown_removals == 1
    assert t.stats()["orphans"] == 1
    stored_s, removed_s = t.rate(window_s=10)
    assert (stored_s, removed_s) == (5 / 3, 1 / 3)   # over 10 s .. 13 s of batch time
    view = block_snapshot(t, seq=3)
    nodes = {n.id: n for n in view.cache.nodes}
    # root -> [1] -> {4, 5}; the orphan 3 hangs under the root, flagged
    assert nodes[1].parent == 0 and nodes[4].parent == 1 and nodes[5].parent == 1
    assert nodes[3].parent == 0 and "orphan" in nodes[3].extra_key
    t.apply(_b(14.0, stored([2], 1, [2, 2])), 4)                            # the parent is back: 3 is adopted
    assert not t.orphans and t.prefixes()[(1, 1, 2, 2, 3, 3)] == 1
    view = block_snapshot(t, seq=4)
    chain = next(n for n in view.cache.nodes if n.slots and 6 in n.slots)   # serial 6 = the re-stored 2
    assert chain.token_ids == (2, 2, 3, 3) and chain.slots == (6, 3) and view.inserted == frozenset({6})
    t.apply(_b(15.0, AllBlocksCleared()), 5)
    assert not t.blocks and t.clears == 1 and t.removed_total == 1 + 5   # block 2 once, then all five


def test_odd_but_legal_events_do_not_break_the_tree():
    t = BlockTree()
    # block_size 0 is treated as 1; short token lists give short blocks; bigram pairs become tuples
    t.apply(_b(1.0, BlockStored([1, 2], None, [7], 0, None, None),
               BlockStored([3], None, [[1, 2], [2, 3]], 2, None, "GPU")), 0)
    assert t.blocks[(0, 1)].tokens == (7,) and t.blocks[(0, 2)].tokens == ()
    assert t.blocks[(0, 3)].tokens == ((1, 2), (2, 3)) and t.media_counts() == {"GPU": 3}
    # vLLM groups: the same hash in two KV cache groups is two blocks
    t.apply(_b(2.0, BlockStored([9], None, [1, 2], 2, None, "GPU", group_idx=0),
               BlockStored([9], None, [1, 2], 2, None, "GPU", group_idx=1)), 1)
    assert (0, 9) in t.blocks and (1, 9) in t.blocks
    t.apply(_b(3.0, BlockRemoved([9], "GPU", group_idx=1)), 2)
    assert (0, 9) in t.blocks and (1, 9) not in t.blocks


def test_a_block_under_itself_or_a_two_block_cycle_stays_an_orphan_and_every_walk_ends():
    """Stored under itself, or A under B then B under A: `convert` walked the chain for ever (path_tokens,
    chain_known) and the blocks were counted but reachable from nowhere. Now such blocks are orphans."""
    t = BlockTree()
    t.apply(_b(1.0, stored([42], 42, [1, 1]), stored([43], 42, [2, 2])), 0)
    assert t.orphans == {(0, 42)} and t.blocks[(0, 42)].children == {(0, 43)}
    assert t.path_tokens((0, 43)) == (1, 1, 2, 2) and t.chain_known((0, 43)) is False
    c = BlockTree()
    c.apply(_b(1.0, stored([7], 8, [7, 7]), stored([8], 7, [8, 8]), stored([9], 7, [9, 9])), 0)
    assert c.orphans == {(0, 7)} and c.blocks[(0, 8)].children == set()          # 8 does not adopt its parent
    assert set(c.top_level()) == {(0, 7)} and c.blocks[(0, 7)].children == {(0, 8), (0, 9)}
    assert c.path_tokens((0, 9)) == (8, 8, 7, 7, 9, 9) and c.chain_known((0, 9)) is False
    assert sum(c.prefixes().values()) == 3                                      # all three reachable, once


def _walk_once(t: BlockTree) -> list:
    """Every block reached from the top level over `children`; a block reached twice or never breaks the tree."""
    seen, todo = [], list(t.top_level())
    while todo:
        key = todo.pop()
        seen.append(key)
        todo.extend(t.blocks[key].children)
    return seen


def test_a_long_chain_adopting_many_orphans_walks_its_ancestors_once():
    """K orphans wait on P, then one event stores a D-block chain ending in P: each adoption walked the whole
    chain again (K x D: 4.5 s at 4,000 x 4,000, inside the lock the page's views take every second)."""
    n = 3000
    t = BlockTree()
    walks = []
    ancestors = t._ancestors
    t._ancestors = lambda key: walks.append(key) or ancestors(key)
    t.apply(_b(1.0, *[stored([10_000 + i], n - 1, [i, i]) for i in range(n)]), 0)        # orphans of block n-1
    assert len(t.orphans) == n
    t.apply(_b(2.0, stored(list(range(n)), None, [7] * (2 * n))), 1)                       # the chain 0 .. n-1
    assert walks == [(0, n - 1)] and not t.orphans                                          # one walk, all adopted
    assert len(t.blocks[(0, n - 1)].children) == n and sorted(_walk_once(t)) == sorted(t.blocks)


def test_a_chain_that_closes_a_cycle_in_one_event_leaves_the_cycle_an_orphan():
    t = BlockTree()
    t.apply(_b(1.0, stored([5], 3, [5, 5])), 0)                       # 5 waits on 3
    t.apply(_b(2.0, stored([1, 2, 3, 4], 5, [1, 1, 2, 2, 3, 3, 4, 4])), 1)   # 1 under 5 ... 3, which 5 waits on
    assert t.orphans == {(0, 5)} and t.blocks[(0, 3)].children == {(0, 4)}
    assert sorted(_walk_once(t)) == sorted(t.blocks)
    # an event passing through a block stored before under another parent walks that block's own chain
    u = BlockTree()
    u.apply(_b(1.0, stored([20], None, [0, 0]), stored([21], 20, [1, 1]), stored([9], 23, [9, 9])), 0)
    u.apply(_b(2.0, stored([30, 21, 22, 23], 9, [3, 3, 1, 1, 2, 2, 3, 3])), 1)   # 21 stays under 20; 23 adopts 9
    assert not u.orphans and u.blocks[(0, 23)].children == {(0, 9)} and (0, 21) in u.blocks[(0, 20)].children
    assert sorted(_walk_once(u)) == sorted(u.blocks)


def test_random_events_keep_every_block_reachable_once():
    import random
    for seed in range(200):
        rng = random.Random(seed)
        t = BlockTree()
        for step in range(12):
            events = []
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.2:
                    events.append(BlockRemoved([rng.randrange(12)], "GPU"))
                else:
                    hashes = [rng.randrange(12) for _ in range(rng.randint(1, 4))]
                    parent = rng.choice([None, rng.randrange(12)])
                    events.append(stored(hashes, parent, [1] * (2 * len(hashes))))
            t.apply(_b(float(step), *events), step)
            reached = _walk_once(t)
            assert sorted(reached) == sorted(t.blocks), (seed, step)
