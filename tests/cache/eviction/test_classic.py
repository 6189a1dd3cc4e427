"""Stateful eviction policies (arc, s3fifo, gdsf, lhd, lecar, recall, recall-value): exact hand-computed behaviour on small
trees, the tree's rules under random flows, and the engine's output equal to the cache-off output."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from core.cache.allocator import SlotAllocator
from core.cache.eviction.registry import DESCRIPTIONS, POLICIES, STATEFUL, EvictionPolicy, is_stateful, make_policy
from core.cache.radix_cache import RadixCache, RadixKey
from core.observe.invariants import check_cache_invariants

NEW = ["gdsf", "arc", "s3fifo", "lhd", "lecar", "recall", "recall-value"]
WHOLE_LEAVES = [p for p in NEW if p != "recall-value"]   # recall-value frees tails: its order is tested apart


class Tree:
    """A cache on an injected clock; `put` caches a prompt as the engine does, `hit` matches it."""

    def __init__(self, policy: str, slots: int = 40, page_size: int = 1) -> None:
        self.t = 0
        self.alloc = SlotAllocator(slots, page_size=page_size)
        self.cache = RadixCache(self.alloc, page_size=page_size, eviction_policy=policy, clock=lambda: self.t)
        self.pol = self.cache.policy

    def put(self, t: float, tokens: list[int], output_len: "int | None" = None) -> None:
        """`output_len`: cached as a finished request that generated that many tokens (told to the policy)."""
        self.t = t
        key = RadixKey(tokens)
        m = self.cache.match_prefix(key)
        self.cache.inc_lock_ref(m.last_node)
        need = len(tokens) - m.indices.numel()
        new = self.alloc.alloc(need) if need else None
        if need and new is None:
            self.cache.evict(need - self.alloc.available())
            new = self.alloc.alloc(need)
        value = torch.cat([m.indices, new]) if new is not None else m.indices
        got = self.cache.insert(key, value, output_len=output_len)
        self.alloc.free(value[m.indices.numel():got])
        m2 = self.cache.match_prefix(key)        # the re-match the scheduler does: same tick, no hit
        self.cache.inc_lock_ref(m2.last_node)
        self.cache.dec_lock_ref(m.last_node)
        self.cache.dec_lock_ref(m2.last_node)
        check_cache_invariants(self.cache)

    def hit(self, t: float, tokens: list[int]) -> None:
        self.t = t
        self.cache.match_prefix(RadixKey(tokens))

    def node(self, tokens: tuple) -> "object":
        (n,) = [n for n in self.cache.nodes()[1:] if tuple(n.key.token_ids.tolist()) == tokens]
        return n

    def evicted(self, fn) -> list[tuple]:
        seq = self.cache.events.last_seq
        fn()
        check_cache_invariants(self.cache)
        return [e.token_ids for e in self.cache.events.since(seq) if e.kind == "evict"]


def test_registry_lists_the_new_policies_with_descriptions():
    for name in NEW:
        assert name in POLICIES and DESCRIPTIONS[name] and is_stateful(name)
        assert isinstance(make_policy(name), STATEFUL[name])
    assert not is_stateful("lru") and isinstance(make_policy("lru"), EvictionPolicy)
    with pytest.raises(ValueError, match="arc, s3fifo"):
        make_policy("ARC")


def test_each_cache_gets_its_own_policy_state():
    a, b = Tree("arc"), Tree("arc")
    a.put(1, [1, 2, 3])
    assert a.pol is not b.pol and a.pol.size == {1: 3, 2: 0} and b.pol.size == {1: 0, 2: 0}


def test_rematch_in_the_same_tick_is_not_a_hit_and_a_later_match_is():
    tr = Tree("gdsf")
    tr.put(1, [1, 2, 3])
    n = tr.node((1, 2, 3))
    assert n.ev_hits == 0 and n.hit_count == 1      # the cache's own counter saw the re-match
    tr.hit(2, [1, 2, 3])
    tr.hit(2, [1, 2, 3])
    assert n.ev_hits == 1
    tr.hit(3, [1, 2])                                # splits: the head keeps the history
    head, tail = tr.node((1, 2)), tr.node((3,))
    assert (head.ev_hits, tail.ev_hits) == (2, 1) and (head.ev_start, tail.ev_start) == (0, 2)


def test_gdsf_values_and_aging_by_the_last_victim():
    tr = Tree("gdsf", slots=6)
    tr.put(1, [1, 1])            # A
    tr.put(2, [2, 2])            # B
    tr.hit(3, [1, 1])            # A: value L + 1 = 1
    tr.hit(4, [1, 1])            # A: value L + 2 = 2
    tr.put(5, [3, 3])            # C: 0
    assert [tr.node(k).ev_h for k in [(1, 1), (2, 2), (3, 3)]] == [2.0, 0.0, 0.0]
    # D needs room: B (value 0, older than C) goes; L stays 0
    assert tr.evicted(lambda: tr.put(6, [4, 4])) == [(2, 2)] and tr.pol.L == 0.0
    tr.hit(7, [3, 3])            # C: 0 + 1
    tr.hit(8, [3, 3])            # C: 0 + 2, a tie with A broken by recency
    assert [tr.node(k).ev_h for k in [(1, 1), (3, 3), (4, 4)]] == [2.0, 2.0, 0.0]
    assert tr.evicted(lambda: tr.cache.evict(1)) == [(4, 4)] and tr.pol.L == 0.0
    assert tr.evicted(lambda: tr.cache.evict(1)) == [(1, 1)] and tr.pol.L == 2.0
    tr.put(9, [7, 7])
    assert tr.node((7, 7)).ev_h == 2.0   # a newcomer enters at L: old counts have aged
    tr.hit(10, [7, 7])
    assert tr.node((7, 7)).ev_h == 3.0   # L + its one hit


def test_s3fifo_one_hit_prefixes_never_displace_a_hot_system_prompt():
    tr = Tree("s3fifo", slots=40)        # small queue: 10 % = 4 tokens
    system = list(range(100, 110))       # 10 tokens, hit once: promoted to main
    tr.put(1, system + [1])
    tr.hit(2, system)
    assert tr.node(tuple(system)).ev_list == 2 and tr.node((1,)).ev_list == 1
    victims = []
    for i in range(12):                  # a scan of 12 one-hit prompts of 8 tokens each
        victims += tr.evicted(lambda: tr.put(3 + i, [200 + 10 * i + j for j in range(8)]))
    assert tuple(system) in [tuple(n.key.token_ids.tolist()) for n in tr.cache.nodes()]
    assert all(len(v) == 8 or v == (1,) for v in victims)          # only scan prompts (and the tail 1)
    lru = Tree("lru", slots=40)
    lru.put(1, system + [1])
    lru.hit(2, system)
    gone = []
    for i in range(12):
        gone += lru.evicted(lambda: lru.put(3 + i, [200 + 10 * i + j for j in range(8)]))
    assert tuple(system) in gone                                     # lru loses it to the scan


def test_s3fifo_ghost_readmits_straight_to_main():
    tr = Tree("s3fifo", slots=20)        # small queue target: 2 tokens
    tr.put(1, [1, 2, 3])
    assert tr.evicted(lambda: tr.put(2, [4, 5, 6])) == []
    assert tr.evicted(lambda: tr.cache.evict(3)) == [(1, 2, 3)]      # small queue first, FIFO
    assert tr.pol.ghost.size == 3
    tr.put(3, [1, 2, 3])                 # back within the ghost's memory: main
    assert tr.node((1, 2, 3)).ev_list == 2 and tr.pol.ghost.size == 0
    assert tr.pol.size == {1: 3, 2: 3}


def test_arc_adapts_its_target_from_ghost_hits():
    tr = Tree("arc", slots=12)
    tr.put(1, [1, 1, 1])                 # A: T1
    tr.put(2, [2, 2, 2])                 # B: T1
    tr.hit(3, [2, 2, 2])                 # B: T2
    assert tr.pol.size == {1: 3, 2: 3} and tr.pol.p == 0.0
    # p = 0 < |T1|: T1 goes first even though B is older in T2's order? B is T2: A goes
    assert tr.evicted(lambda: tr.cache.evict(1)) == [(1, 1, 1)]
    assert tr.pol.b1.size == 3
    tr.put(4, [1, 1, 1])                 # ghost hit in B1: p += 3 * max(1, |B2|/|B1|) = 3, A -> T2
    assert tr.pol.p == 3.0 and tr.node((1, 1, 1)).ev_list == 2 and tr.pol.b1.size == 0
    tr.put(5, [3, 3, 3])                 # C: T1 (3 tokens, not above p = 3): T2's LRU goes first
    assert tr.evicted(lambda: tr.cache.evict(1)) == [(2, 2, 2)]
    assert tr.pol.b2.size == 3
    tr.put(6, [2, 2, 2])                 # ghost hit in B2: p -= 3 * max(1, 0 / 3) = 0
    assert tr.pol.p == 0.0
    assert tr.pol.size == {1: 3, 2: 6} == {1: 3, 2: tr.cache.total_size() - 3}


def test_lecar_follows_the_expert_whose_victims_do_not_come_back():
    import math
    tr = Tree("lecar", slots=6)
    tr.put(1, [1, 1])                    # A
    tr.put(2, [2, 2])                    # B
    tr.hit(3, [1, 1])                    # A: arc's T2, gdsf value 1
    tr.put(4, [3, 3])                    # C
    assert tr.evicted(lambda: tr.cache.evict(1)) == [(2, 2)]          # equal weights: arc's T1 LRU
    assert tr.pol.regret[0].size == 2 and tr.pol.regret[1].size == 0
    tr.put(5, [2, 2])                    # arc's victim is back after 2 of 6 tokens inserted: arc pays
    f = math.exp(-0.45 * 0.005 ** (2 / 6))
    assert tr.pol.w == pytest.approx([f / (f + 1), 1 / (f + 1)], abs=1e-12)
    # gdsf now leads: C (value 0, older than B) goes; arc alone would take A (T2's LRU, p = 2 = |T1|)
    assert tr.evicted(lambda: tr.cache.evict(1)) == [(3, 3)]
    assert tr.pol.expert == 1 and tr.pol.regret[1].size == 2
    arc = Tree("arc", slots=6)
    for t, p in [(1, [1, 1]), (2, [2, 2])]:
        arc.put(t, p)
    arc.hit(3, [1, 1])
    arc.put(4, [3, 3])
    arc.cache.evict(1)
    arc.put(5, [2, 2])
    assert arc.evicted(lambda: arc.cache.evict(1)) == [(1, 1)]


def test_lhd_starts_as_lru_then_follows_the_learned_densities():
    tr = Tree("lhd", slots=400)         # one update per 100 inserted tokens: none yet
    for i, t in enumerate([1, 2, 3]):
        tr.put(t, [10 * (i + 1)] * 4)
    tr.hit(4, [10] * 4)
    order = [tuple(n.key.token_ids.tolist()) for n in tr.cache.eviction_order()]
    assert order == [(20,) * 4, (30,) * 4, (10,) * 4]               # no history: lru
    pol = tr.pol
    pol.hits[:] = 0
    pol.evicts[:] = 0
    c0 = pol.ev_size_of(4)                                          # class row of a 4-token node, 0 hits
    pol.hits[c0, 0], pol.evicts[c0, 2] = 8.0, 8.0                   # class 0: hit at age 0 or evicted at 2
    pol.hits[c0 + 1, 1] = 4.0                                       # class 1: hit at age 1
    pol._update()
    # density(c0, a=0) = 8 / (8*1 + 8*3) = 0.25; (c0, 1) = 0 / (8*2) = 0; (c0+1, 0) = 4 / (4*2) = 0.5
    assert pol.density[c0][0] == 0.25 and pol.density[c0][1] == 0.0 and pol.density[c0 + 1][0] == 0.5
    assert pol.hits[c0, 0] == 8.0 * 0.5 ** 0.25                     # decayed by half per pool
    width = pol.width
    tr.node((20,) * 4).ev_time = pol.clock - width                  # age bucket 1: density 0
    order = [tuple(n.key.token_ids.tolist()) for n in tr.cache.eviction_order()]
    assert order == [(20,) * 4, (30,) * 4, (10,) * 4]
    assert pol.key(tr.node((10,) * 4))[0] == 0.5 and pol.key(tr.node((30,) * 4))[0] == 0.25


def random_flow(tr: "Tree", seed: int, steps: int, page_size: int, put=None) -> None:
    """Prompts sharing random stems put into `tr`, with paths locked and released at random; after every
    step the policy's sizes (where it keeps them) add up and `evictable_leaves` is exactly the unlocked
    leaves; at the end everything is released and evicted, and every slot is free again."""
    rng = random.Random(seed)
    put = put or tr.put
    stems = [[rng.randrange(1, 30) for _ in range(rng.randrange(4, 40))] for _ in range(6)]
    locked = []
    for t in range(1, steps):
        p = stems[rng.randrange(6)][:rng.randrange(0, 40)] + [rng.randrange(1, 30) for _ in range(rng.randrange(1, 16))]
        p = p[:len(p) - len(p) % page_size] or [1] * page_size
        if rng.random() < 0.2 and tr.cache.evictable_size():
            m = tr.cache.match_prefix(RadixKey(p))
            tr.cache.inc_lock_ref(m.last_node)
            locked.append(m.last_node)
        if len(locked) > 3 or (locked and rng.random() < 0.3):
            tr.cache.dec_lock_ref(locked.pop(0))
        if tr.cache.evictable_size() + tr.alloc.available() >= len(p):
            put(t, p)
        if hasattr(tr.pol, "size"):
            assert sum(tr.pol.size.values()) == tr.cache.total_size()
        leaves = {n for n in tr.cache.nodes()[1:] if n.is_leaf and n.lock_ref == 0}
        assert set(tr.cache.evictable_leaves) == leaves
    for n in locked:
        tr.cache.dec_lock_ref(n)
    tr.cache.evict(10 ** 6)
    check_cache_invariants(tr.cache)
    assert tr.cache.total_size() == 0 and tr.alloc.available() == tr.alloc.num_slots


@pytest.mark.parametrize("policy", NEW)
@pytest.mark.parametrize("page_size", [1, 4])
def test_random_flows_keep_the_tree_rules_and_the_policy_sizes(policy, page_size):
    random_flow(Tree(policy, slots=96, page_size=page_size), 11 * len(policy) + page_size, 160, page_size)


@pytest.mark.parametrize("policy", NEW)
def test_reset_forgets_the_policy_state(policy):
    tr = Tree(policy, slots=8)
    for t, p in enumerate([[1, 2, 3], [4, 5, 6], [1, 2, 3], [7, 8, 9]], 1):
        tr.put(t, p)
        tr.hit(t + 0.5, p)
    tr.cache.evict(10)
    pol = tr.pol
    assert pol.clock == 9            # tokens inserted: [1,2,3] came back from the cache, not anew
    tr.cache.reset()
    assert tr.cache.policy is pol and pol.clock == 0
    if policy in ("gdsf", "lecar"):
        assert pol.L == 0.0
    if policy == "lecar":
        assert pol.w == [0.5, 0.5] and all(g.size == 0 for g in pol.regret)
    if policy in ("arc", "s3fifo", "lecar"):
        assert pol.size == {1: 0, 2: 0}
        ghosts = [pol.b1, pol.b2] if policy != "s3fifo" else [pol.ghost]
        assert all(g.size == 0 and not g.d for g in ghosts)
    if policy in ("arc", "lecar"):
        assert pol.p == 0.0
    if policy == "lhd":
        assert not pol.hits.any() and not pol.evicts.any()


@pytest.fixture(scope="module")
def engine_case():
    """A tiny Llama, prompts sharing three system prompts, and their greedy outputs with the cache off."""
    from core.engine.engine import Engine
    from core.engine.sampling import SamplingParams
    from tests.tiny_models import tiny_pair

    _, runner = tiny_pair("llama")
    rng = random.Random(11)
    systems = [[rng.randrange(1, 128) for _ in range(16)] for _ in range(3)]
    prompts = [systems[i % 3] + [rng.randrange(1, 128) for _ in range(rng.randrange(2, 7))] for i in range(9)]
    off = Engine(runner, pool_slots=64, disable_radix_cache=True)
    want = [c.token_ids for c in off.generate(prompts, SamplingParams(max_new_tokens=4))]
    return runner, prompts, want


@pytest.mark.parametrize("policy", NEW + ["lrb", "lrb-arc"])   # lrb*: core/cache/eviction/learned.py
def test_engine_greedy_output_with_a_new_policy_equals_cache_off(engine_case, policy):
    """A pool small enough that every policy must evict: outputs stay token-for-token exact."""
    from core.engine.engine import Engine
    from core.engine.sampling import SamplingParams

    runner, prompts, want = engine_case
    e = Engine(runner, pool_slots=64, eviction_policy=policy, max_running_requests=2)
    got = e.generate(prompts, SamplingParams(max_new_tokens=4))
    assert [c.token_ids for c in got] == want
    assert e.cache.evicted_tokens > 0 and sum(c.cached_tokens for c in got) > 0
    e.check_invariants()
    assert e.allocator.available() + e.cache.total_size() == 64


@pytest.mark.parametrize("policy", WHOLE_LEAVES + ["lrb", "lrb-arc"])   # lrb*: core/cache/eviction/learned.py
def test_eviction_order_reads_without_moving_the_policy_on(policy):
    """The dashboard's snapshot asks for eviction_order at any time: that must change nothing."""
    tr = Tree(policy, slots=16)
    for t in range(1, 30):
        tr.put(t, [t % 5 + 1, t % 3 + 1, t])
        tr.hit(t + 0.5, [t % 5 + 1])

    def state():
        return {k: (v.tolist() if isinstance(v, np.ndarray) else repr(v)) for k, v in vars(tr.pol).items()}

    before = state()
    first = tr.cache.eviction_order()
    assert state() == before and tr.cache.eviction_order() == first
    assert tr.evicted(lambda: tr.cache.evict(10 ** 6))[:3] == [tuple(n.key.token_ids.tolist()) for n in first[:3]]
