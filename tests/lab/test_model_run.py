"""The "through the real model" run on a tiny random model: the engine's measured hit rate is the
replay's prediction, greedy outputs match with the cache off, and oversized runs are refused."""
from __future__ import annotations

import pytest

from core.lab.model_run import MAX_REQUESTS, check_model_run, engine_workload, fold_prompts, run_through_model
from core.lab.workloads import generated_shared_prefix, multi_turn_chat
from tests.tiny_models import tiny_pair


@pytest.fixture(scope="module")
def runner():
    return tiny_pair("llama")[1]


@pytest.fixture(scope="module")
def workload():
    return generated_shared_prefix(num_groups=2, prompts_per_group=3, system_prompt_len=48, question_len=8,
                                   output_len=4, seed=3)


@pytest.mark.parametrize("capacity, page_size", [(400, 1), (120, 1), (400, 4)])
def test_measured_hit_rate_is_the_replays_prediction(runner, workload, capacity, page_size):
    rep = run_through_model(runner, workload, capacity, "lru", page_size, max_new_tokens=3)
    assert rep.outputs_equal and len(rep.on.outputs) == len(workload)
    assert all(len(o) == 3 for o in rep.on.outputs)
    assert rep.off.cached_tokens == 0 and rep.off.prompt_tokens == workload.prompt_tokens
    assert rep.on.cached_tokens == rep.predicted.hit_tokens
    if capacity == 120:
        # both evict, the same tokens: the replay caches prompts at prefill end as the engine does
        assert rep.on.evicted_tokens == rep.predicted.evicted_tokens > 0
    table = rep.table()
    assert list(table.run) == ["engine, radix cache on", "engine, cache off", "replay (predicted)"]


def test_prompts_are_folded_into_the_vocabulary(runner, workload):
    prompts = fold_prompts(workload, runner.vocab_size)
    assert all(0 <= t < runner.vocab_size for p in prompts for t in p)
    folded = engine_workload(workload, prompts, 5)
    assert [r.output_len for r in folded.requests] == [5] * len(workload)


def test_progress_is_reported_per_request_and_engine(runner, workload):
    calls = []
    run_through_model(runner, workload, 400, max_new_tokens=1, progress=lambda d, t, what: calls.append((d, t)))
    assert calls[-1] == (2 * len(workload), 2 * len(workload)) and len(calls) == 2 * len(workload)


@pytest.mark.parametrize("kwargs, message", [
    (dict(wl=generated_shared_prefix(num_groups=7, prompts_per_group=7, system_prompt_len=8, question_len=4)),
     f"49 requests; the model run takes at most {MAX_REQUESTS}"),
    (dict(wl=multi_turn_chat(num_sessions=2, turns=3, system_prompt_len=200, user_len=30, output_len=30)),
     "longest prompt has 350 tokens"),
    (dict(pool=40), "cannot hold the longest prompt (56 tokens) plus 4 new tokens"),
    (dict(pool=100_000), "pick a smaller capacity"),
    (dict(pool=2, page_size=4), "below one page of 4"),
    (dict(new=0), "new tokens per request must be between 1 and 16"),
])
def test_bad_model_runs_are_refused(workload, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_model_run(kwargs.get("wl", workload), kwargs.get("pool", 400), kwargs.get("page_size", 1),
                        kwargs.get("new", 4))


def test_block_traces_are_refused():
    from core.lab.workloads import TraceRequest, Workload
    wl = Workload("mc", [TraceRequest(None, 2, 0.0, hash_ids=[1, 2], input_len=600)])
    with pytest.raises(ValueError, match="block trace"):
        check_model_run(wl)


@pytest.mark.parametrize("page_size", [1, 4])
def test_prompts_cached_whole_are_predicted_as_the_engine_hits_them(runner, page_size):
    """Four identical 16-token prompts: the engine computes each prompt's last token (it needs its logits), so a
    repeat hits 15 tokens, or at pages of 4 three pages (12); the replay predicted 16 and overstated the hit rate
    by a whole page a request at page size 4 (0.75 against 0.5625)."""
    from core.lab.workloads import TraceRequest, Workload
    same = Workload("same", [TraceRequest(list(range(1, 17)), 2) for _ in range(4)])
    rep = run_through_model(runner, same, 400, "lru", page_size, max_new_tokens=2)
    assert rep.on.cached_tokens == rep.predicted.hit_tokens == 3 * (15 if page_size == 1 else 12)
