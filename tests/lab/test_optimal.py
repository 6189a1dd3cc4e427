"""The bounds: infinite capacity and the offline optimum, checked against brute force and the paper."""
from __future__ import annotations

import gzip
import json
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.lab.optimal import _NEVER, Bounds, belady_hits, capacity_pages, next_counted_use
from core.lab.page_trace import Overlap, page_trace
from core.lab.workloads import TraceRequest, Workload

MOONCAKE_TABLE2 = 0.66   # Mooncake FAST'25, Table 2: cache ratio at infinite capacity


def scan_mooncake(path) -> tuple[int, int]:
    """(whole blocks hit at infinite capacity, distinct whole pages cached), straight from the JSON lines: a whole
    block hits when the same chain of hash ids up to it came before; output pages are each request's own."""
    seen, hit_blocks, own_pages = set(), 0, 0
    with gzip.open(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            whole = r["input_length"] // 512
            chains = [tuple(r["hash_ids"][:k + 1]) for k in range(whole)]
            hit_blocks += sum(c in seen for c in chains)
            seen.update(chains)
            own_pages += (r["input_length"] + max(r["output_length"] - 1, 0)) // 512 - whole
    return hit_blocks, len(seen) + own_pages


def test_mooncake_infinite_capacity_matches_the_paper(mooncake, mooncake_path):
    b = Bounds(mooncake, page_size=512)
    assert abs(b.infinite().hit_rate - MOONCAKE_TABLE2) <= 0.02
    hit_blocks, distinct = scan_mooncake(mooncake_path)
    assert b.infinite().hit_tokens == hit_blocks * 512 and hit_blocks == 77_740   # 39,802,880 tokens
    assert b.distinct_pages == distinct == 40_965


def test_mooncake_optimum_grows_with_capacity_and_reaches_infinite(mooncake):
    """Deterministic values (Belady's MIN itself is checked against an independent scan on trace slices in
    test_replay.py and against brute force below); 20,000 pages already hold all that can ever hit."""
    b = Bounds(mooncake, page_size=512)
    got = [b.optimal(c * 512).hit_tokens for c in (500, 2000, 6000, 12000, 20000)]
    assert got == [12_417_024, 23_654_912, 34_468_352, 39_496_192, 39_802_880]
    assert b.optimal(20000 * 512).hit_tokens == b.infinite().hit_tokens
    assert b.optimal(b.distinct_pages * 512).hit_tokens == b.infinite().hit_tokens


@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.data())
def test_next_counted_use_matches_a_scan(pages, data):
    counted = data.draw(st.lists(st.booleans(), min_size=len(pages), max_size=len(pages)))
    depth = data.draw(st.lists(st.integers(0, 9), min_size=len(pages), max_size=len(pages)))
    got = next_counted_use(np.array(pages, dtype=np.int64), np.array(counted), np.array(depth, dtype=np.int64))
    for i, p in enumerate(pages):
        later = [j for j in range(i + 1, len(pages)) if pages[j] == p and counted[j]]
        assert got[i] == (later[0] if later else _NEVER + depth[i])


def brute_force_optimum(trace, capacity: int) -> int:
    """Max prefix hits over every admission/eviction schedule (exponential; tiny traces only).

    A counted page hits only if it is cached and every earlier prompt page of its request hit."""
    pages, counted, depth = trace.pages.tolist(), trace.counted.tolist(), trace.depth.tolist()
    n = len(pages)

    @lru_cache(maxsize=None)
    def best(i: int, cache: frozenset, chain: bool) -> int:
        if i == n:
            return 0
        p, c = pages[i], counted[i]
        if c and depth[i] == 0:
            chain = True
        if p in cache:
            return (1 if c and chain else 0) + best(i + 1, cache, chain)
        chain = False if c else chain
        options = [best(i + 1, cache, chain)]
        if len(cache) < capacity:
            options.append(best(i + 1, cache | {p}, chain))
        else:
            options += [best(i + 1, (cache - {q}) | {p}, chain) for q in cache]
        return max(options)
    return best(0, frozenset(), False)


tiny_tokens = st.lists(st.integers(0, 2), min_size=1, max_size=4)


@st.composite
def tiny_workloads(draw):
    reqs = [TraceRequest(draw(tiny_tokens), output=draw(st.lists(st.integers(0, 2), max_size=3)))
            for _ in range(draw(st.integers(1, 5)))]
    for r in reqs:
        if r.output_len == 0:
            r.output_len = 1       # a request generates at least one token
    return Workload("tiny", reqs)


@settings(max_examples=150, deadline=None)
@given(tiny_workloads(), st.integers(1, 3), st.sampled_from([1, 2]))
def test_belady_equals_brute_force_optimum(workload, capacity, page_size):
    trace = page_trace(workload, page_size)
    assert belady_hits(trace, capacity) == brute_force_optimum(trace, capacity)


def test_optimum_equals_infinite_once_every_page_fits():
    from core.lab.workloads import multi_turn_chat, tree_of_thought
    for w in (multi_turn_chat(num_sessions=4, turns=3, system_prompt_len=40, user_len=8, output_len=12),
              tree_of_thought(num_problems=2, branching=2, depth=3, problem_len=30, step_len=4, thought_len=9)):
        for ps in (1, 4):
            b = Bounds(w, ps)
            assert b.optimal(b.distinct_pages * ps).hit_tokens == b.infinite().hit_tokens
            assert b.optimal(ps).hit_tokens <= b.infinite().hit_tokens


def test_multi_turn_answers_count_toward_the_bounds():
    """Turn 2's prompt holds turn 1's answer: it hits because the answer was cached when turn 1 finished."""
    w = Workload("chat", [TraceRequest([1, 2, 3], output=[7, 8, 9]), TraceRequest([1, 2, 3, 7, 8, 9, 4], output=[5])])
    b = Bounds(w, 1)
    assert b.infinite().hit_tokens == 5        # 1 2 3 7 8 (9 was never computed: the last token has no KV)
    assert b.optimal(7).hit_tokens == 5        # turn 2 holds 7 tokens (7 + 1 - 1): a smaller pool rejects it
    assert b.optimal(6).hit_tokens == 0


def test_overlap_changes_what_can_hit():
    """With overlap, B arrives before A has finished: A's prompt is cached (hit), its answer not yet."""
    a = TraceRequest([1, 2], output=[3, 4, 5], timestamp=0.0)
    b = TraceRequest([1, 2, 3, 4, 6], output=[7], timestamp=10.0)
    w = Workload("o", [a, b])
    assert Bounds(w, 1).infinite().hit_tokens == 4
    assert Bounds(w, 1, Overlap(ms_per_output_token=20.0)).infinite().hit_tokens == 2
    assert Bounds(w, 1, Overlap(ms_per_output_token=1.0)).infinite().hit_tokens == 4


def test_capacity_below_one_page_is_rejected(mooncake):
    b = Bounds(mooncake.slice(0, 10), 512)
    with pytest.raises(ValueError, match="below one page of 512 tokens"):
        b.optimal(511)
    with pytest.raises(ValueError, match="below one page"):
        capacity_pages(0, 1)
    with pytest.raises(ValueError, match="integer"):
        capacity_pages(2.5, 1)
