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
