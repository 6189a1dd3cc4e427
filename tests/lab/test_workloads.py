"""Workload generators and the TraceRequest model: shapes, sharing structure, determinism, bad input."""
from __future__ import annotations

import numpy as np
import pytest

from core.lab.workloads import (
    GENERATORS,
    OUTPUT_ID_BASE,
    TraceRequest,
    Workload,
    concat,
    few_shot,
    generated_shared_prefix,
    make_workload,
    multi_turn_chat,
    tree_of_thought,
    workload_params,
)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    d = np.flatnonzero(a[:n] != b[:n])
    return int(d[0]) if d.size else n


def test_shared_prefix_grouped_has_sglang_shape():
    w = generated_shared_prefix(num_groups=3, prompts_per_group=4, system_prompt_len=50, question_len=7,
                                output_len=5, order="grouped", seed=0)
    assert len(w) == 12
    assert all(r.prompt_len == 57 and r.output_len == 5 for r in w.requests)
    p = [r.prompt_ids() for r in w.requests]
    assert all(common_prefix(p[0], p[i]) >= 50 for i in range(1, 4))       # one group, back to back
    assert all((p[4 * g][:50] == p[4 * g + 3][:50]).all() for g in range(3))
    assert not (p[0][:50] == p[4][:50]).all()                             # groups differ


def test_shared_prefix_shuffled_is_a_permutation_of_grouped():
    kw = dict(num_groups=3, prompts_per_group=4, system_prompt_len=20, question_len=5, output_len=2, seed=7)
    g = generated_shared_prefix(order="grouped", **kw)
    s = generated_shared_prefix(order="shuffled", **kw)
    as_set = lambda w: sorted(tuple(r.prompt_ids().tolist()) for r in w.requests)
    assert as_set(g) == as_set(s)
    assert [tuple(r.prompt_ids().tolist()) for r in g.requests] != [tuple(r.prompt_ids().tolist()) for r in s.requests]


def test_generators_are_deterministic_per_seed():
    a = multi_turn_chat(num_sessions=3, turns=3, seed=5)
    b = multi_turn_chat(num_sessions=3, turns=3, seed=5)
    c = multi_turn_chat(num_sessions=3, turns=3, seed=6)
    same = lambda x, y: all((r.prompt_ids() == q.prompt_ids()).all() for r, q in zip(x.requests, y.requests))
    assert same(a, b) and not same(a, c)


def test_multi_turn_history_contains_previous_answers():
    w = multi_turn_chat(num_sessions=2, turns=3, system_prompt_len=10, user_len=4, output_len=6, order="sequential")
    r0, r1, r2 = w.requests[:3]
    assert r1.prompt_len == r0.prompt_len + 6 + 4 and r2.prompt_len == r1.prompt_len + 10
    assert (r1.prompt_ids()[:r0.prompt_len] == r0.prompt_ids()).all()
    assert (r1.prompt_ids()[r0.prompt_len:r0.prompt_len + 6] == r0.output_ids()).all()
    # interleaved order: turn 0 of both sessions first
    w2 = multi_turn_chat(num_sessions=2, turns=3, system_prompt_len=10, user_len=4, output_len=6)
    assert [r.prompt_len for r in w2.requests] == [14, 14, 24, 24, 34, 34]


def test_few_shot_and_tree_of_thought_structure():
    w = few_shot(num_requests=20, num_tasks=2, examples_len=30, question_len=3, output_len=2, seed=3)
    heads = {tuple(r.prompt_ids()[:30].tolist()) for r in w.requests}
    assert len(heads) == 2 and all(r.prompt_len == 33 for r in w.requests)
    t = tree_of_thought(num_problems=2, branching=2, depth=3, problem_len=8, step_len=2, thought_len=3)
    assert len(t) == 2 * (1 + 2 + 4)
    root, child = t.requests[0], t.requests[1]
    assert (child.prompt_ids()[:root.prompt_len] == root.prompt_ids()).all()
    assert (child.prompt_ids()[root.prompt_len:root.prompt_len + 3] == root.output_ids()).all()
    d = tree_of_thought(num_problems=1, branching=2, depth=3, problem_len=8, step_len=2, thought_len=3, order="dfs")
    # dfs: root, first child, its first child
    assert [r.prompt_len for r in d.requests[:3]] == [10, 15, 20]


def test_block_request_expands_hash_ids_and_fresh_outputs():
    r = TraceRequest(hash_ids=[3, 9], input_len=700, output_len=4, block_size=512)
    ids = r.prompt_ids()
    assert len(ids) == 700 and ids[0] == 3 * 512 and ids[511] == 3 * 512 + 511 and ids[512] == 9 * 512
    w = Workload("x", [r, TraceRequest(hash_ids=[3], input_len=10, output_len=4)])
    a, b = w.requests[0].output_ids(), w.requests[1].output_ids()
    assert a.min() >= OUTPUT_ID_BASE and not set(a.tolist()) & set(b.tolist())
    assert len(r.cached_ids()) == 703 and (r.cached_ids()[700:] == a[:3]).all()


def test_timestamps_from_request_rate():
    """Poisson arrivals at 10 requests/s: 4,000 gaps average 100 ms within 5% (the standard error is 1.6%) and
    spread like an exponential (standard deviation = mean), not evenly; the first request arrives at 0."""
    w = few_shot(num_requests=4001, examples_len=4, question_len=1, output_len=1, request_rate=10.0)
    ts = np.array([r.timestamp for r in w.requests])
    gaps = np.diff(ts)
    assert ts[0] == 0.0 and (gaps >= 0).all() and w.has_timestamps
    assert 95.0 < gaps.mean() < 105.0
    assert 0.9 < gaps.std() / gaps.mean() < 1.1
    assert abs(np.median(gaps) - 100.0 * np.log(2)) < 6.0     # exponential median: mean * ln 2
    assert few_shot(num_requests=5).has_timestamps is False


def test_concat_keeps_phases_in_order():
    a = few_shot(num_requests=3, examples_len=5, question_len=1)
    b = few_shot(num_requests=2, examples_len=5, question_len=1, seed=2)
    w = concat(a, b)
    assert len(w) == 5 and [r.rid for r in w.requests] == list(range(5))
    assert (w.requests[3].prompt_ids() == b.requests[0].prompt_ids()).all()


@pytest.mark.parametrize("call, msg", [
    (lambda: generated_shared_prefix(num_groups=0), "num_groups"),
    (lambda: generated_shared_prefix(order="random"), "order"),
    (lambda: multi_turn_chat(turns=-1), "turns"),
    (lambda: tree_of_thought(order="zigzag"), "order"),
    (lambda: few_shot(request_rate=0), "request_rate"),
    (lambda: few_shot(request_rate=float("nan")), "request_rate"),      # NaN timestamps were made silently
    (lambda: few_shot(request_rate=float("inf")), "request_rate"),
    (lambda: make_workload("generated-shared-prefix", seed="abc"), "seed"),   # a traceback from numpy before
    (lambda: make_workload("generated-shared-prefix", seed=1.5), "seed"),
    (lambda: make_workload("generated-shared-prefix", seed=-1), "seed"),
    (lambda: make_workload("generated-shared-prefix", vocab_size=10**30), "vocab_size"),
    (lambda: multi_turn_chat(seed=True), "seed"),
    (lambda: make_workload("nope"), "generated-shared-prefix"),
    (lambda: make_workload("few-shot", bogus=1), "bogus"),
    (lambda: Workload("empty", []), "no requests"),
    (lambda: TraceRequest([], 1), "non-empty"),
    (lambda: TraceRequest(hash_ids=[1, 2], input_len=300), "does not fit"),
    (lambda: TraceRequest([1, 2], output_len=-1), "output_len"),
])
def test_bad_parameters_raise_value_error(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_every_generator_runs_with_defaults_listed():
    """Each generator builds with exactly the defaults workload_params lists, to the request count and prompt
    lengths its parameters imply."""
    expect = {
        "generated-shared-prefix": lambda p: (p["num_groups"] * p["prompts_per_group"],
                                              {p["system_prompt_len"] + p["question_len"]}),
        "multi-turn-chat": lambda p: (p["num_sessions"] * p["turns"],
                                      {p["system_prompt_len"] + t * (p["user_len"] + p["output_len"]) + p["user_len"]
                                       for t in range(p["turns"])}),
        "few-shot": lambda p: (p["num_requests"], {p["examples_len"] + p["question_len"]}),
        "tree-of-thought": lambda p: (p["num_problems"] * sum(p["branching"] ** k for k in range(p["depth"])),
                                      {p["problem_len"] + p["step_len"] + k * (p["thought_len"] + p["step_len"])
                                       for k in range(p["depth"])}),
    }
    assert set(expect) == set(GENERATORS)
    for name in GENERATORS:
        params = workload_params(name)
        assert "seed" in params and params["request_rate"] is None
        w = make_workload(name, **params)
        n, lengths = expect[name](params)
        assert len(w) == n and {r.prompt_len for r in w.requests} == lengths, name
        assert all(w.params[k] == v for k, v in params.items() if k in w.params), name


@pytest.mark.parametrize("name, params, words", [
    ("tree-of-thought", dict(branching=10, depth=9), "make at least"),
    ("tree-of-thought", dict(branching=10, depth=10**9), "make at least"),
    ("generated-shared-prefix", dict(num_groups=20_000, prompts_per_group=100), "make 2,000,000 requests"),
    ("multi-turn-chat", dict(num_sessions=100, turns=1000), "prompt tokens in all"),
    ("few-shot", dict(num_requests=10**6, examples_len=4096), "prompt tokens in all"),
])
def test_a_workload_too_big_to_hold_is_refused_before_it_is_built(name, params, words):
    """A form field has no natural limit: tree-of-thought at branching 10, depth 9 ran out of memory after 26 s
    (and depth 6, 126 M tokens, took 14 s at every rerun of the page)."""
    import time
    from core.lab.workloads import make_workload
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"{words}.*holds at most 1,000,000 requests and 100,000,000 tokens"):
        make_workload(name, **params)
    assert time.perf_counter() - t0 < 1.0


def test_the_size_estimate_is_exact_for_the_defaults(monkeypatch):
    """Each generator's estimate is what it builds: at exactly its tokens it builds, one token less it refuses."""
    from core.lab import workload_size
    from core.lab import workloads as wl
    for name in wl.GENERATORS:
        monkeypatch.setattr(workload_size, "MAX_GENERATED_TOKENS", 10 ** 9)
        w = wl.make_workload(name)
        tokens = w.prompt_tokens + ((w.params["num_tasks"] * w.params["examples_len"]) if name == "few-shot" else 0)
        monkeypatch.setattr(workload_size, "MAX_GENERATED_TOKENS", tokens)
        assert len(wl.make_workload(name)) == len(w)
        monkeypatch.setattr(workload_size, "MAX_GENERATED_TOKENS", tokens - 1)
        with pytest.raises(ValueError, match=f"make {len(w):,} requests of {tokens:,} prompt tokens"):
            wl.make_workload(name)
