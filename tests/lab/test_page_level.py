"""The page-level replay (one tree slot per page) gives exactly the token-level replay's numbers (the engine's
own RadixCache keyed by token): every policy, page size, capacity, overlap or not, generated or traced."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.cache.eviction.registry import POLICIES, is_stateful
from core.lab.optimal import Bounds
from core.lab.page_trace import Overlap, page_trace
from core.lab.replay import pool_pages_needed, replay
from core.lab.workloads import (
    TraceRequest,
    Workload,
    few_shot,
    generated_shared_prefix,
    multi_turn_chat,
    tree_of_thought,
)

ALL = [p for p in POLICIES if not is_stateful(p)]   # auto replays stateful policies by token (replay.py)


def numbers(r):
    return (r.hit_tokens, r.evictions, r.evicted_tokens, r.rejected, r.capacity_pages, r.prompt_tokens)


def generated(rate=None):
    return [
        generated_shared_prefix(num_groups=5, prompts_per_group=4, system_prompt_len=61, question_len=9,
                                output_len=7, order="shuffled", seed=3, request_rate=rate),
        multi_turn_chat(num_sessions=4, turns=3, system_prompt_len=21, user_len=6, output_len=10, seed=2,
                        request_rate=rate),
        few_shot(num_requests=24, num_tasks=3, examples_len=50, question_len=6, output_len=4, seed=1,
                 request_rate=rate),
        tree_of_thought(num_problems=2, branching=2, depth=3, problem_len=30, step_len=3, thought_len=8, seed=4,
                        request_rate=rate),
    ]


@pytest.mark.parametrize("page_size", [1, 2, 8, 16])
@pytest.mark.parametrize("overlap", [None, Overlap(ms_per_output_token=15.0)], ids=["sequential", "overlap"])
def test_page_level_equals_token_level_on_generated_workloads(page_size, overlap):
    for w in generated(rate=None if overlap is None else 25.0):
        for pages in (2, 5, 13, 40):
            for policy in ALL:
                cap = pages * page_size
                tok = replay(w, cap, policy, page_size, overlap, level="token")
                pag = replay(w, cap, policy, page_size, overlap, level="page", check_invariants=(pages == 5))
                assert (tok.level, pag.level) == ("token", "page")
                assert numbers(pag) == numbers(tok), (w.name, page_size, pages, policy)


@pytest.mark.parametrize("page_size", [512, 1024, 256])
def test_page_level_equals_token_level_on_trace_slices(mooncake, page_size):
    """512: a page is a block; 1024: two blocks (still no expansion); 256: half a block (expanded to tokens)."""
    for start in (0, 2000):
        w = mooncake.slice(start, start + 100)
        trace = page_trace(w, page_size)
        for pages in (60, 400):
            for policy in ALL:
                cap = pages * page_size
                tok = replay(w, cap, policy, page_size, level="token")
                assert numbers(replay(w, cap, policy, page_size, level="page")) == numbers(tok), (start, pages, policy)
                assert numbers(replay(w, cap, policy, page_size, trace=trace)) == numbers(tok)


def test_page_level_equals_token_level_with_overlap_on_a_trace_slice(mooncake):
    w = mooncake.slice(500, 700)
    ov = Overlap(ms_per_output_token=40.0, ms_per_prompt_token=0.05)
    for pages in (150, 700):
        for policy in ("lru", "lfu", "mru", "slru"):
            tok = replay(w, pages * 512, policy, 512, ov, level="token")
            assert numbers(replay(w, pages * 512, policy, 512, ov)) == numbers(tok), (pages, policy)


def test_a_pool_beyond_what_the_workload_can_fill_is_not_allocated(mooncake):
    """'1000G' on a 50-request trace: replayed with the pages the workload can use, with the same numbers."""
    w = mooncake.slice(0, 50)
    b = Bounds(w, 512)
    need = pool_pages_needed(w, 512, distinct=b.distinct_pages)
    assert need == b.distinct_pages + max(-(-r.cached_len // 512) for r in w.requests)
    huge = replay(w, 10 ** 12, "lru", 512)
    assert huge.pool_pages == need and huge.capacity_pages == 10 ** 12 // 512
    exact = replay(w, need * 512, "lru", 512, level="token")
    assert numbers(huge)[:4] == numbers(exact)[:4] == (b.infinite().hit_tokens, 0, 0, 0)
    assert replay(w, 10 ** 12, "lru", 512, level="token").pool_pages <= sum(-(-r.cached_len // 512) for r in w.requests) * 2


def test_progress_inside_a_point_reaches_the_end(mooncake):
    seen = []
    replay(mooncake.slice(0, 300), 500 * 512, "lru", 512, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (600, 600) and len(seen) >= 100 and [d for d, _ in seen] == sorted(d for d, _ in seen)


@st.composite
def small_workloads(draw):
    reqs = []
    for i in range(draw(st.integers(1, 8))):
        prompt = draw(st.lists(st.integers(0, 3), min_size=1, max_size=14))
        out = draw(st.lists(st.integers(0, 3), min_size=1, max_size=6))
        extra = draw(st.sampled_from([None, None, "a"]))
        reqs.append(TraceRequest(prompt, output=out, timestamp=float(draw(st.integers(0, 40))) + 8 * i, extra_key=extra))
    return Workload("small", reqs)


@settings(max_examples=80, deadline=None)
@given(small_workloads(), st.integers(1, 10), st.sampled_from(ALL), st.sampled_from([1, 2, 3, 4]), st.booleans())
def test_property_page_level_equals_token_level(w, pages, policy, page_size, overlap):
    ov = Overlap(ms_per_output_token=5.0) if overlap else None
    tok = replay(w, pages * page_size, policy, page_size, ov, level="token")
    assert numbers(replay(w, pages * page_size, policy, page_size, ov, level="page", check_invariants=True)) \
        == numbers(tok)


def test_the_host_tier_seam_sees_evicted_pages_and_serves_later_misses():
    """The seam for a second tier: on_arrive gets the device's hit pages, match() is asked for the matchable
    prompt pages after it (never the page of the prompt's last token, which the engine computes), on_insert gets the pages entering the tree, on_reject a request that found no room, on_evict the
    trie ids of every evicted page; what it serves counts apart, and the device flow does not change."""
    class Host:
        def __init__(self):
            self.held, self.asked, self.calls = [], [], []

        def on_arrive(self, i, ids):
            self.calls.append(("arrive", i, ids.tolist()))

        def match(self, ids):
            self.asked.append(ids.tolist())
            n = 0
            while n < len(ids) and int(ids[n]) in self.held:
                n += 1
            return n

        def on_reject(self, i):
            self.calls.append(("reject", i))

        def on_insert(self, i, ids, depth):
            self.calls.append(("insert", i, ids.tolist(), depth))

        def on_evict(self, ids):
            self.held += ids.tolist()
            self.calls.append(("evict", ids.tolist()))

    a, b = list(range(8)), list(range(10, 18))
    w = Workload("ab", [TraceRequest(a, 1), TraceRequest(b, 1), TraceRequest(a, 1)])
    host = Host()
    r = replay(w, 8, "lru", 4, host=host)     # a pool of 2 pages of 4: b evicts a, a comes back
    plain = replay(w, 8, "lru", 4)
    assert numbers(r) == numbers(plain) and (r.hit_tokens, r.evictions, r.evicted_tokens) == (0, 2, 16)
    assert sorted(host.held) == [0, 1, 2, 3] and r.host_hit_tokens == 4   # a's 2 pages, then b's (ids 2, 3)
    assert host.asked == [[0], [2], [0]]                                    # a's first page comes back from host
    assert host.calls == [("arrive", 0, []), ("insert", 0, [0, 1], 0),
                          ("arrive", 1, []), ("evict", [0, 1]), ("insert", 1, [2, 3], 0),
                          ("arrive", 2, []), ("evict", [2, 3]), ("insert", 2, [0, 1], 0)]
    with pytest.raises(ValueError, match="page-level"):
        replay(w, 8, "lru", 4, level="token", host=host)
    with pytest.raises(ValueError, match="host= must implement core.lab.replay.HostTier .*; object lacks on_arrive, "
                                         "match, on_reject, on_insert, on_evict"):
        replay(w, 8, "lru", 4, host=object())

    # a device hit (a's 2 pages, ids 0, 1), then a new prompt page (2) and an output page (3, at finish); a
    # prompt of 5 pages in a pool of 4 evicts the chain leaf first ([3], [2], [0, 1]) and is still rejected
    w = Workload("hit-reject", [TraceRequest(a, 1), TraceRequest(a + [50] * 4, output=[60] * 5), TraceRequest(list(range(20, 40)), 1)])
    host = Host()
    r = replay(w, 16, "lru", 4, host=host)
    assert numbers(r) == numbers(replay(w, 16, "lru", 4))
    assert (r.hit_tokens, r.rejected, r.evictions, r.evicted_tokens, r.host_hit_tokens) == (8, 1, 3, 16, 0)
    assert host.asked == [[0], [4, 5, 6, 7]]       # the second's 2 matchable pages are on the device: not asked
    assert host.calls == [("arrive", 0, []), ("insert", 0, [0, 1], 0),
                          ("arrive", 1, [0, 1]), ("insert", 1, [2], 2), ("insert", 1, [3], 3),
                          ("arrive", 2, []), ("evict", [3]), ("evict", [2]), ("evict", [0, 1]), ("reject", 2)]


def test_auto_replays_stateful_policies_by_token():
    """Their ghosts name a node by its first units: page ids are not tokens, so auto keeps the engine's level."""
    w = generated(rate=None)[0]
    assert replay(w, 40 * 8, "arc", 8).level == "token" and replay(w, 40 * 8, "lru", 8).level == "page"
