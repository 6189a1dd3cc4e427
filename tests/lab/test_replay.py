"""Replay through the real RadixCache: the paper's LRU figure, the bound, known answers, bad input."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.cache.eviction.registry import POLICIES
from core.lab.optimal import Bounds
from core.lab.page_trace import Overlap, page_trace
from core.lab.replay import replay
from core.lab.workloads import (
    TraceRequest,
    Workload,
    concat,
    few_shot,
    generated_shared_prefix,
    multi_turn_chat,
    tree_of_thought,
)
from tests.lab.reference import accesses, reference_infinite, reference_lru, reference_optimum

ALL = list(POLICIES)


def test_mooncake_lru_at_6000_blocks_matches_figure_9(mooncake):
    """Mooncake FAST'25 Figure 9: a 3M-token LRU cache reaches about 46% of the maximum. The replay is
    deterministic: 19,666,432 hit tokens (0.3214, 49.4% of the maximum), the same as a plain page-level LRU
    over an OrderedDict (tests/lab/reference.py). FIFO (0.3126) or priority would fail it."""
    inf = Bounds(mooncake, 512).infinite().hit_rate
    r = replay(mooncake, 6000 * 512, "lru", page_size=512)
    assert r.requests == 3993 and r.rejected == 0 and r.prompt_tokens == 61_194_628
    assert r.hit_tokens == reference_lru(mooncake, 6000, 512) == 19_666_432
    assert round(r.hit_rate, 4) == 0.3214 and round(r.hit_rate / inf, 3) == 0.494
    assert replay(mooncake, 6000 * 512, "fifo", page_size=512).hit_tokens != r.hit_tokens
    assert r.evictions > 0 and r.evicted_tokens >= r.evictions * 512 and r.evicted_tokens % 512 == 0


def generated(rate=None):
    return [
        generated_shared_prefix(num_groups=5, prompts_per_group=4, system_prompt_len=60, question_len=8,
                                output_len=6, order="shuffled", seed=3, request_rate=rate),
        multi_turn_chat(num_sessions=4, turns=3, system_prompt_len=20, user_len=6, output_len=10, seed=2,
                        request_rate=rate),
        few_shot(num_requests=24, num_tasks=3, examples_len=50, question_len=6, output_len=4, seed=1,
                 request_rate=rate),
        tree_of_thought(num_problems=2, branching=2, depth=3, problem_len=30, step_len=3, thought_len=8, seed=4,
                        request_rate=rate),
    ]


def fitting_accesses(w: Workload, page_size: int, pages: int, overlap) -> list:
    """(page, counted) of `w`'s page trace without the requests a pool of `pages` pages rejects whatever the
    policy (they hold more pages): built from a workload of the others alone."""
    kept = [r for r in w.requests if -(-r.cached_len // page_size) <= pages]
    if not kept:
        return []
    t = page_trace(Workload(w.name, kept), page_size, overlap)
    return list(zip(t.pages.tolist(), t.counted.tolist()))


@pytest.mark.parametrize("page_size", [1, 8])
@pytest.mark.parametrize("overlap", [None, Overlap(ms_per_output_token=15.0)], ids=["sequential", "overlap"])
def test_optimum_bounds_every_policy_on_generated_workloads(page_size, overlap):
    """The optimum is Belady's MIN (an independent scan, tests/lab/reference.py), every policy stays at or below
    it, and LRU stays at or above a plain page-level LRU (which drops parents before children)."""
    for w in generated(rate=None if overlap is None else 25.0):
        b = Bounds(w, page_size, overlap)
        if overlap is None:
            assert b.infinite().hit_tokens == reference_infinite(w, page_size), w.name
        for pages in (8, 24, 64, 96):   # at page 1 the smallest request holds 59: below, nothing fits
            if overlap is None:
                seq = accesses(w, page_size, pages)
            else:
                seq = fitting_accesses(w, page_size, pages, overlap)
            opt = b.optimal(pages * page_size).hit_tokens
            assert opt == reference_optimum(seq, pages) * page_size, (w.name, pages)
            for policy in ALL:
                r = replay(w, pages * page_size, policy, page_size, overlap, check_invariants=(pages == 64))
                assert r.hit_tokens <= opt, (w.name, pages, policy)
                if policy == "lru" and overlap is None:
                    assert r.hit_tokens >= reference_lru(w, pages, page_size), (w.name, pages)
        assert b.optimal(64 * page_size).hit_tokens <= b.infinite().hit_tokens
    # the bounds are not trivial: the smallest pools hold back the optimum, the largest reach the infinite rate
    w = generated()[2]
    b = Bounds(w, page_size)
    assert 0 < b.optimal(64).hit_tokens < b.infinite().hit_tokens


def test_optimum_bounds_every_policy_on_trace_slices(mooncake):
    """On Mooncake slices LRU is exactly the plain page-level LRU, the optimum exactly Belady's MIN by scan,
    the infinite rate exactly the scan of the hash ids; every other policy stays at or below the optimum."""
    for start in (0, 2000):
        w = mooncake.slice(start, start + 250)
        b = Bounds(w, 512)
        inf = reference_infinite(w, 512)
        assert b.infinite().hit_tokens == inf
        for pages in (100, 600, 2000):
            opt = b.optimal(pages * 512).hit_tokens
            assert opt == reference_optimum(accesses(w, 512, pages), pages) * 512, (start, pages)
            assert opt < inf or pages > 100
            for policy in ALL:
                r = replay(w, pages * 512, policy, 512)
                assert r.hit_tokens <= opt, (start, pages, policy)
                if policy == "lru":
                    assert r.hit_tokens == reference_lru(w, pages, 512), (start, pages)
        assert b.optimal(b.distinct_pages * 512).hit_tokens == inf


@pytest.mark.parametrize("page_size", [1, 8])
def test_every_policy_reaches_infinite_when_every_page_fits(page_size):
    for w in generated():
        b = Bounds(w, page_size)
        cap = (b.distinct_pages + 1) * page_size        # every page + the running request's partial page
        for policy in ALL:
            r = replay(w, cap, policy, page_size)
            assert (r.hit_tokens, r.evictions, r.rejected) == (b.infinite().hit_tokens, 0, 0), (w.name, policy)


@st.composite
def small_workloads(draw):
    n = draw(st.integers(1, 8))
    reqs = []
    for i in range(n):
        prompt = draw(st.lists(st.integers(0, 3), min_size=1, max_size=12))
        out = draw(st.lists(st.integers(0, 3), min_size=1, max_size=5))
        reqs.append(TraceRequest(prompt, output=out, timestamp=float(draw(st.integers(0, 50))) + 10 * i))
    return Workload("small", reqs)


@settings(max_examples=60, deadline=None)
@given(small_workloads(), st.integers(1, 12), st.sampled_from(ALL), st.sampled_from([1, 2, 4]), st.booleans())
def test_property_replay_never_beats_the_optimum(w, pages, policy, page_size, overlap):
    """replay <= optimum <= infinite, with the optimum equal to Belady's MIN by an independent scan, and the
    replay equal to the infinite rate once the pool holds every page (so a replay stuck at 0 fails)."""
    ov = Overlap(ms_per_output_token=4.0) if overlap else None
    b = Bounds(w, page_size, ov)
    r = replay(w, pages * page_size, policy, page_size, ov, check_invariants=True)
    opt = b.optimal(pages * page_size).hit_tokens
    assert opt == reference_optimum(fitting_accesses(w, page_size, pages, ov), pages) * page_size
    assert r.hit_tokens <= opt <= b.infinite().hit_tokens
    if not overlap:
        assert b.infinite().hit_tokens == reference_infinite(w, page_size)
        big = (b.distinct_pages + max(-(-q.cached_len // page_size) for q in w.requests)) * page_size
        assert replay(w, big, policy, page_size).hit_tokens == b.infinite().hit_tokens


def test_grouped_shared_prefix_one_group_pool_reaches_the_maximum():
    """Grouped order, a pool of exactly one request (one group's prompt + a question + output - 1): LRU hits
    every shared system prompt. So does LFU: the running request locks its group's prompt while it allocates,
    and the question leaves it evicts are never reused."""
    S, Q, O = 128, 16, 8
    w = generated_shared_prefix(num_groups=4, prompts_per_group=6, system_prompt_len=S, question_len=Q,
                                output_len=O, order="grouped", seed=5)
    inf = Bounds(w, 1).infinite().hit_tokens
    assert inf == 4 * 5 * S
    cap = S + Q + O - 1
    assert replay(w, cap, "lru").hit_tokens == inf
    assert replay(w, cap, "lfu").hit_tokens == inf
    assert replay(w, cap - 1, "lru").rejected == len(w)      # one slot short: nothing fits
    shuffled = generated_shared_prefix(num_groups=4, prompts_per_group=6, system_prompt_len=S, question_len=Q,
                                       output_len=O, order="shuffled", seed=5)
    assert replay(shuffled, cap, "lru").hit_tokens < 0.5 * inf  # the same pool fails when groups interleave


def test_lfu_keeps_a_stale_hot_prefix_and_does_far_worse_than_lru():
    """A group hit 32 times, then two new groups alternate in a pool for two groups: LRU drops the stale
    prefix and reaches the maximum; LFU keeps it (32 hits) and thrashes the two live ones."""
    S, Q, O = 256, 16, 8
    hot = generated_shared_prefix(num_groups=1, prompts_per_group=32, system_prompt_len=S, question_len=Q,
                                  output_len=O, order="grouped", seed=11)
    later = generated_shared_prefix(num_groups=2, prompts_per_group=16, system_prompt_len=S, question_len=Q,
                                    output_len=O, order="shuffled", seed=12)
    w = concat(hot, later)
    cap = 2 * (S + Q + O) + S // 2
    inf = Bounds(w, 1).infinite()
    lru, lfu = replay(w, cap, "lru"), replay(w, cap, "lfu")
    assert lru.hit_tokens == inf.hit_tokens
    assert lfu.hit_rate <= lru.hit_rate - 0.15


def test_overlap_running_requests_hold_their_slots():
    """A runs 0..60 ms holding 8 slots of an 8-slot pool: B, arriving at 10 ms, finds no room and is rejected.
    Without overlap A has finished and B evicts it: two nodes, since A's prompt went into the tree
    when its prefill ended and its output joined below it when it finished (as the engine does)."""
    a = TraceRequest(list(range(6)), output=[90, 91, 92], timestamp=0.0)
    b = TraceRequest(list(range(100, 106)), output=[93, 94, 95], timestamp=10.0)
    w = Workload("pair", [a, b])
    ov = Overlap(ms_per_output_token=20.0)
    r = replay(w, 8, "lru", overlap=ov, check_invariants=True)
    assert r.rejected == 1 and r.hit_tokens == 0
    r = replay(w, 8, "lru", check_invariants=True)
    assert r.rejected == 0 and r.evictions == 2 and r.evicted_tokens == 8


def test_overlap_later_arrivals_hit_a_running_prompt():
    """cache_unfinished_req: A's prompt is in the tree as soon as A starts, so B hits it while A still runs."""
    a = TraceRequest(list(range(10)), output=[50] * 5, timestamp=0.0)
    b = TraceRequest(list(range(10)) + [77], output=[51], timestamp=1.0)
    w = Workload("pair", [a, b])
    r = replay(w, 64, "lru", overlap=Overlap(ms_per_output_token=10.0), check_invariants=True)
    assert r.hit_tokens == 10 and r.rejected == 0


def test_progress_callback_reaches_the_end():
    seen = []
    replay(few_shot(num_requests=30, examples_len=20, question_len=2), 64, "lru",
           progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (60, 60) and len(seen) >= 10


def test_bad_input():
    w = few_shot(num_requests=3, examples_len=10, question_len=2)
    with pytest.raises(ValueError, match="below one page of 16 tokens"):
        replay(w, 15, "lru", page_size=16)
    with pytest.raises(ValueError, match="lru, lfu, fifo, mru, filo, priority, slru"):
        replay(w, 64, "random")
    with pytest.raises(ValueError, match="timestamp"):
        replay(w, 64, "lru", overlap=Overlap())
    with pytest.raises(ValueError, match="non-negative"):
        Overlap(ms_per_output_token=-1)


def test_the_replay_tells_the_policy_each_finished_requests_output_length():
    """recall-value's pages carry the output bit length of the request that inserted them, whether the
    finish inserted output pages (A, B) or nothing new (C: one output token has no KV to cache)."""
    from core.lab.page_trace import event_order
    from core.lab.replay import _Replayer, _run
    from core.lab.workloads import TraceRequest, Workload

    a = list(range(1, 9))
    w = Workload("told", [TraceRequest(a, 3), TraceRequest(a[:4] + [20, 21, 22, 23], 9), TraceRequest(list(range(30, 36)), 1)])
    rep = _Replayer(w, 64, "recall-value", 1, False, True, None, None)
    _run(rep, event_order(w, None), False, None)

    def request_of(n) -> int:
        while n.parent is not rep.cache.root_node:
            n = n.parent
        return int(n.key.token_ids[0])

    got = sorted((request_of(n), len(n.key), n.ev_out) for n in rep.cache.nodes()[1:])
    # A's head and tail (B split it) and its 2 output tokens: 3 = 0b11; B's 4 new tokens and 8 output
    # tokens: 9 = 0b1001; C's prompt: 1
    assert got == [(1, 2, 2), (1, 4, 2), (1, 4, 2), (1, 4, 4), (1, 8, 4), (30, 6, 1)]
