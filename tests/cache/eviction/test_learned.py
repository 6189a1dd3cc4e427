"""`lrb` / `lrb-arc` (core/cache/eviction/learned.py): delayed labels computed by hand (live hits, split halves,
reuse after eviction, reuse past the boundary), the fit, the learned dead-first order, the tree's rules
under random flows, determinism, and the engine's greedy output equal to the cache-off output."""
from __future__ import annotations

import numpy as np
import pytest

from core.cache.eviction.learned import BINS, FEATURES, LRB, LRBARC
from core.cache.eviction.registry import DESCRIPTIONS, POLICIES, STATEFUL, is_stateful, make_policy
from core.cache.radix_cache import RadixKey
from tests.cache.eviction.test_classic import Tree, random_flow

LEARNED = ["lrb", "lrb-arc"]


def labels(pol) -> list[tuple]:
    return [(s.t, s.size, round(s.label, 6)) for s in pol.pending]


def test_registry_offers_both_learned_policies():
    for name, cls in (("lrb", LRB), ("lrb-arc", LRBARC)):
        assert name in POLICIES and DESCRIPTIONS[name] and is_stateful(name)
        assert isinstance(make_policy(name), cls) and STATEFUL[name] is cls


def test_boundary_and_periods_are_multiples_of_the_pool():
    pol = Tree("lrb", slots=400).pol
    assert (pol.window, pol.period, pol.unit, pol.next_update) == (400, 100, 6, 100)


def test_a_hit_within_the_boundary_labels_the_share_of_the_node_asked_for():
    tr = Tree("lrb", slots=80)                   # boundary 80 tokens inserted, first retrain at 20
    tr.put(1, list(range(1, 11)))                # node of 10 tokens: one sample at clock 10
    assert labels(tr.pol) == [(10, 10, 0.0)]
    tr.hit(2, [1, 2, 3, 4, 99])                  # splits: the head (4 tokens) is asked for again
    assert labels(tr.pol)[0] == (10, 10, 0.4)
    tr.hit(3, list(range(1, 11)))                # one request through both halves: 4 + 6 of 10
    assert labels(tr.pol)[0] == (10, 10, 1.0)
    head = tr.node((1, 2, 3, 4))
    assert head.ev_hits == 2 and head.ev_gap == 0   # no token was inserted between the two hits


def test_reuse_after_eviction_is_seen_through_the_ghost_and_late_reuse_is_not():
    tr = Tree("lrb", slots=8)                    # boundary = 8 tokens inserted
    tr.put(1, [1, 2, 3, 4])                      # clock 4: samples of [1..4] (insert, periodic)
    a = list(tr.node((1, 2, 3, 4)).ev_samples)
    tr.put(2, [5, 6, 7, 8])                      # clock 8
    tr.put(3, [9, 10, 11, 12])                   # clock 12: evicts [1..4]; its samples go to its ghost
    assert [s.t for s in a] == [4, 4] and all(s.label == 0.0 for s in a)
    assert len(tr.pol.ghosts) == 1
    tr.put(4, [1, 2, 3, 4, 13, 14])              # clock 18 > 4 + 8: back past the boundary, no credit
    assert all(s.label == 0.0 for s in a)

    tr2 = Tree("lrb", slots=8)
    tr2.put(1, [1, 2, 3, 4])
    tr2.put(2, [5, 6, 7, 8])
    b = list(tr2.node((5, 6, 7, 8)).ev_samples)
    assert [s.t for s in b] == [8, 8]
    tr2.put(3, [1, 2, 3, 4, 9, 10])              # hits [1..4], evicts [5..8] (least recently used)
    assert all(s.label == 0.0 for s in b) and len(tr2.pol.ghosts) == 1
    tr2.put(4, [5, 6, 7, 8, 11, 12])             # clock 16 <= 8 + 8: the ghost labels all 4 tokens
    assert [s.label for s in b] == [1.0, 1.0]
    # its ghost is used up; the ones left are [9, 10] and [1..4], which this put evicted (in that order)
    assert [g[1].shape[0] for g in tr2.pol.ghosts.values()] == [2, 4]


def test_a_namespace_is_part_of_a_page_name_so_another_tenant_does_not_label_it():
    from core.cache.allocator import SlotAllocator
    from core.cache.radix_cache import RadixCache

    def run(back_ns: str) -> list[float]:
        alloc = SlotAllocator(8)                 # boundary: 8 tokens inserted
        cache = RadixCache(alloc, eviction_policy="lrb")

        def put(tokens: list[int], ns: str) -> None:
            cache.tick()
            if alloc.available() < len(tokens):
                cache.evict(len(tokens) - alloc.available())
            cache.insert(RadixKey(tokens, extra_key=ns), alloc.alloc(len(tokens)))

        put([1, 2, 3, 4], "tenant-a")            # clock 4
        samples = list(cache.nodes()[1].ev_samples)
        put([5, 6, 7, 8], "tenant-a")            # clock 8: the pool is full
        put([1, 2, 3, 4], back_ns)               # clock 12: evicts tenant-a's [1..4], then inserts these
        return [s.label for s in samples]

    assert run("tenant-a") == [1.0, 1.0]         # the same pages came back within the boundary
    assert run("tenant-\udcff") == [0.0, 0.0]    # same tokens, another (non-UTF-8) namespace: not them


def test_labels_become_training_rows_once_their_boundary_has_passed():
    tr = Tree("lrb", slots=8)
    for t in range(1, 9):
        tr.put(t, [t, t + 100])                  # 2 tokens each: a retrain period (2 tokens) per put
    pol = tr.pol
    assert pol.n > 0 and all(now_minus <= pol.window for now_minus in (pol.clock - s.t for s in pol.pending))
    rows = pol.X[:pol.n]
    assert rows.shape[1] == len(FEATURES) and (rows // BINS == np.arange(len(FEATURES))).all()


def test_the_fit_predicts_what_the_regularised_optimum_predicts():
    """Two retrains (six backfitting sweeps) must predict within 1e-3 of the exact optimum, which the
    full Newton method on the dense one-hot matrix finds; and the fitted bins order as the data do."""
    pol = Tree("lrb", slots=64).pol
    rng = np.random.default_rng(5)
    m = 400
    cols = np.stack([f * BINS + rng.integers(0, 4, m) for f in range(len(FEATURES))], axis=1)
    y = (rng.random(m) < 1 / (1 + np.exp(-(cols[:, 0] % BINS - 1.5)))).astype(float)
    pol.X[:m], pol.y[:m], pol.n = cols, y, m
    d = 1 + len(FEATURES) * BINS
    X = np.zeros((m, d))
    X[:, 0] = 1
    X[np.arange(m)[:, None], 1 + cols] = 1
    reg = np.full(d, 1.0)
    reg[0] = 0
    w = np.zeros(d)
    for _ in range(30):
        p = 1 / (1 + np.exp(-X @ w))
        w -= np.linalg.solve((X * (p * (1 - p))[:, None]).T @ X + np.diag(reg + 1e-9), X.T @ (p - y) + reg * w)
    assert np.abs(X.T @ (1 / (1 + np.exp(-X @ w)) - y) + reg * w).max() < 1e-9
    pol._train()
    pol._train()
    fitted = 1 / (1 + np.exp(-(X @ np.array([pol.bias] + pol.table))))
    assert pol.trained and pol.trainings == 2
    assert np.abs(fitted - 1 / (1 + np.exp(-X @ w))).max() < 1e-3
    assert pol.table[0] < pol.table[1] < pol.table[2] < pol.table[3]


def test_starts_as_lru_then_keeps_what_returns_where_lru_loses_it():
    """One-off 3-token prompts never return; three 9-token prompts return every third step. Before a model
    lrb is LRU. Once trained, it evicts the one-offs (predicted dead) even when the long prompts are older,
    while LRU, on the same flow, evicts long prompts that were about to come back."""
    lrb, lru = Tree("lrb", slots=36), Tree("lru", slots=36)   # 3 long prompts + 3 one-offs fill the pool
    longs = [list(range(10 * k, 10 * k + 9)) for k in range(1, 4)]
    shorts = iter([1000 + 10 * k, 1001 + 10 * k, 1002 + 10 * k] for k in range(10 ** 4))
    for t, p in enumerate(longs + [next(shorts), next(shorts)], 1):
        lrb.put(t, p)
        lru.put(t, p)
    assert not lrb.pol.trained
    assert [n.key.token_ids.tolist() for n in lrb.cache.eviction_order()] == \
           [n.key.token_ids.tolist() for n in lru.cache.eviction_order()]
    t = 10
    for step in range(150):
        t += 1
        p = next(shorts)
        for tr in (lrb, lru):
            tr.put(t, longs[step % 3])           # a hit, or back in if it was evicted
            tr.put(t + 0.5, p)
    pol = lrb.pol
    assert pol.trained and pol.trainings > 10
    assert pol.probability(lrb.node(tuple(p))) < pol.dead < min(pol.probability(lrb.node(tuple(q))) for q in longs)
    t += 1
    for tr in (lrb, lru):
        for q in longs:
            tr.put(t, q)
    for k in range(5):                           # five new one-offs after the long prompts were last used
        p = next(shorts)
        lrb.put(t + 1 + k, p)
        lru.put(t + 1 + k, p)
    kept = lambda tr: [q for q in longs if tr.cache.peek_prefix_len(RadixKey(q)) == len(q)]
    assert kept(lrb) == longs
    assert kept(lru) == longs[1:]                # LRU lost the long prompt it touched first


@pytest.mark.parametrize("policy", LEARNED)
@pytest.mark.parametrize("page_size", [1, 4])
def test_random_flows_keep_the_tree_rules_and_are_deterministic(policy, page_size):
    def flow():
        tr, order = Tree(policy, slots=96, page_size=page_size), []
        random_flow(tr, 7 + page_size, 240, page_size,
                    put=lambda t, p: order.extend(tr.evicted(lambda: tr.put(t, p))))
        return order, tr.pol.table, tr.pol.trainings

    a, b = flow(), flow()
    assert a == b and a[2] > 0 and a[0]


@pytest.mark.parametrize("policy", LEARNED)
def test_reset_forgets_what_was_learned(policy):
    tr = Tree(policy, slots=8)
    for t in range(1, 60):
        tr.put(t, [t % 7, t % 5 + 10, t])
    assert tr.pol.n > 0
    tr.cache.reset()
    pol = tr.pol
    assert (pol.n, pol.clock, len(pol.pending), len(pol.ghosts), pol.trained, pol.trainings) == (0, 0, 0, 0, False, 0)
