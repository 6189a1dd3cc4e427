"""Known answers written to kill the lab's mutation survivors (scripts/mutants_catalog.py): namespaces at page
level, the host tier's rules for a full host and for a rejected request, and the time estimate leaving
rejected requests out. Each states the rule from core/lab/host_tier.py's docstring and its exact outcome."""
from __future__ import annotations

import pytest

from core.lab.host_tier import replay_with_host
from core.lab.page_trace import request_pages
from core.lab.replay import replay
from core.lab.units import load_model_config
from core.lab.workloads import TraceRequest, Workload

A, B, C = list(range(40)), list(range(100, 140)), list(range(200, 240))


def test_namespaces_never_share_pages_at_page_level():
    """The same prompt under two extra_keys: two sets of page ids, and no hit across them (token level agrees)."""
    w = Workload("ns", [TraceRequest(A * 2, output=[1], extra_key="x"), TraceRequest(A * 2, output=[2], extra_key="y"),
                        TraceRequest(A * 2 + [5], output=[3], extra_key="x")])
    pages = request_pages(w, 4)
    assert set(pages[0][0].tolist()).isdisjoint(pages[1][0].tolist())
    assert pages[2][0][:20].tolist() == pages[0][0][:20].tolist()
    for level in ("page", "token"):
        r = replay(w, 400, "lru", 4, level=level)
        assert r.hit_tokens == 80, level                # only the third request hits, its own namespace's 80


def test_a_full_host_keeps_pages_still_on_the_device():
    """write_through, host of 40 pages: A fills it; B's writes find only pages whose device copy is still
    there (A is on the device), so they are dropped, not written over A (SGLang's evict_host)."""
    w = Workload("ab", [TraceRequest(A, output=[7]), TraceRequest(B, output=[8])])
    r = replay_with_host(w, 120, 40, "lru", 1, write_policy="write_through")
    assert (r.host_writes, r.dropped_writes, r.host_evictions) == (40, 40, 0)


def test_a_rejected_request_gives_back_what_it_loaded():
    """write_back, device of 48, host of 64: B evicts A to host; C (100 tokens, A's 40 first) loads A's pages
    back, then finds no room and is rejected: the loads are undone, so D (A + 1) still hits A's 40 on host."""
    w = Workload("abcd", [TraceRequest(A, output=[7]), TraceRequest(B, output=[8]), TraceRequest(A + list(range(300, 360)), output=[9]),
                          TraceRequest(A + [1], output=[6])])
    r = replay_with_host(w, 48, 64, "lru", 1, write_policy="write_back")
    assert r.rejected.tolist() == [False, False, True, False]
    assert r.device_hits.tolist() == [0, 0, 0, 0] and r.host_hits.tolist() == [0, 0, 0, 40]


def test_the_time_estimate_leaves_rejected_requests_out():
    """A (40 tokens) fits a device of 48; C (100) never does: only A is timed."""
    w = Workload("ac", [TraceRequest(A, output=[7]), TraceRequest(C + list(range(400, 460)), output=[8])])
    r = replay_with_host(w, 48, 64, "lru", 1)
    assert r.rejected.tolist() == [False, True]
    t = r.ttft(load_model_config("llama-3.1-8b"), prefill_tokens_per_s=1000.0)
    assert t["requests"] == 1
    assert t["prefill_seconds_device_only"] == pytest.approx(0.040) == t["prefill_seconds_with_host"]
    assert t["ttft_p99_device_only"] == pytest.approx(0.040)


@pytest.mark.parametrize("ps", [1, 4])
def test_a_policy_may_reach_the_goal_exactly_where_the_search_starts(ps):
    """size_policy's `start` is the optimum's bracket: below its lower end every policy misses, and at its
    answer the policy may already reach the goal. Started at the policy's own answer, the search returns it."""
    from core.lab.optimal import Bounds
    from core.lab.size import SizeAnswer, size_policy
    from core.lab.workloads import generated_shared_prefix
    w = generated_shared_prefix(num_groups=3, prompts_per_group=4, system_prompt_len=32, question_len=6,
                                output_len=4, order="shuffled", seed=3)
    b = Bounds(w, ps)
    own = size_policy(w, "lru", b)
    assert own.capacity_pages is not None and own.lower_pages < own.capacity_pages
    start = SizeAnswer("optimal", 0.9, own.goal_hit_tokens, ps, own.capacity_pages, own.capacity_pages - 1, None,
                       own.prompt_tokens)
    again = size_policy(w, "lru", b, start=start)
    assert (again.capacity_pages, again.lower_pages) == (own.capacity_pages, own.capacity_pages - 1)
