"""The engine on tiny random models: exact greedy output with the cache, chunking, paging,
retraction, aborts at every stage, bad input, and concurrency."""
from __future__ import annotations

import random
import threading

import pytest
import torch

from core.engine import Engine
from core.request import ABORTED, FINISHED, RUNNING, WAITING
from core.sampling import SamplingParams
from tests.tiny_models import CONFIGS, reference_greedy, tiny_pair


def _prompts(n: int, shared: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, 128) for _ in range(shared)]
    return [system + [rng.randrange(1, 128) for _ in range(rng.randrange(1, 12))] for _ in range(n)]


def _no_leak(e: Engine) -> None:
    """Idle engine: every slot is free or owned by the tree, and the invariants hold."""
    e.check_invariants()
    assert not e.scheduler.running
    assert e.allocator.available() + e.cache.total_size() == e.allocator.num_slots
    assert e.cache.protected_size() == 0


def _one_per_step(e: Engine, prompts: list[list[int]], max_new_tokens: int) -> list:
    """Submit one request per scheduler step (so extends mix with earlier decodes), then drain."""
    handles = []
    for p in prompts:
        handles.append(e.submit(p, SamplingParams(max_new_tokens=max_new_tokens)))
        e.step()
        e.check_invariants()
    _drain(e)
    return handles


def _drain(e: Engine) -> None:
    while e.has_work():
        e.step()
        e.check_invariants()


@pytest.mark.parametrize("family", list(CONFIGS))
def test_greedy_equals_generate_with_mixed_batches(family):
    """Requests arrive one per step, so each step mixes a new extend (reusing the shared
    prefix) with the decodes of earlier requests; a small budget also chunks prefills."""
    ref, runner = tiny_pair(family)
    e = Engine(runner, pool_slots=400, max_prefill_tokens=16)
    prompts = _prompts(6, shared=20, seed=1)
    handles = _one_per_step(e, prompts, 12)
    for p, h in zip(prompts, handles):
        c = h.result(0)
        assert c.token_ids == reference_greedy(ref, p, 12)
        assert c.finish_reason == "length"
    # the first request found nothing; the second found the first 16-token chunk the first
    # request had cached; later ones the whole shared system prompt.
    assert [h.result(0).cached_tokens for h in handles] == [0, 16, 20, 20, 20, 20]
    _no_leak(e)


def test_cache_off_gives_same_tokens_and_no_hits():
    ref, runner = tiny_pair("llama")
    prompts = _prompts(5, shared=24, seed=2)
    outs = {}
    for disable in (False, True):
        e = Engine(runner, pool_slots=400, disable_radix_cache=disable)
        outs[disable] = e.generate(prompts, SamplingParams(max_new_tokens=8))
        _no_leak(e)
        if disable:
            assert e.cache.total_size() == 0 and e.allocator.available() == 400
    assert [c.token_ids for c in outs[False]] == [c.token_ids for c in outs[True]]
    assert [c.cached_tokens for c in outs[True]] == [0] * 5
    # lpm runs all five in one batch; none was cached when they were admitted together
    assert sum(c.cached_tokens for c in outs[False]) == 0


def test_fully_cached_prompt_recomputes_only_its_last_token():
    ref, runner = tiny_pair("qwen2")
    e = Engine(runner, pool_slots=200)
    p = _prompts(1, shared=10, seed=3)[0]
    first = e.generate([p], SamplingParams(max_new_tokens=4))[0]
    computed_before = e.metrics.prefill_computed
    again = e.generate([p], SamplingParams(max_new_tokens=4))[0]
    assert again.cached_tokens == len(p) - 1
    assert e.metrics.prefill_computed - computed_before == 1
    assert again.token_ids == first.token_ids == reference_greedy(ref, p, 4)
    _no_leak(e)


@pytest.mark.parametrize("page_size", [2, 4])
def test_paged_engine_matches_generate(page_size):
    ref, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=256, page_size=page_size, max_prefill_tokens=12)
    prompts = _prompts(5, shared=13, seed=4)
    handles = _one_per_step(e, prompts, 7)
    for p, h in zip(prompts, handles):
        assert h.result(0).token_ids == reference_greedy(ref, p, 7)
        assert h.result(0).cached_tokens % page_size == 0
    assert all(len(n.token_ids) % page_size == 0 for n in e.snapshot().cache.nodes[1:])
    _no_leak(e)


def test_retraction_when_decoding_runs_out_of_slots():
    """A pool that cannot hold every running request to the end: the newest is retracted,
    its tokens stay cached, and re-admission hits them. Outputs stay exact."""
    ref, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=48, max_prefill_tokens=64)
    prompts = _prompts(3, shared=0, seed=5)
    prompts = [p + [7] * (12 - len(p)) for p in prompts]  # 12 tokens each
    handles = [e.submit(p, SamplingParams(max_new_tokens=14)) for p in prompts]
    _drain(e)
    assert e.scheduler.retractions >= 1
    for p, h in zip(prompts, handles):
        assert h.result(0).token_ids == reference_greedy(ref, p, 14)
    _no_leak(e)


def test_abort_at_every_stage_releases_everything():
    ref, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=200, max_prefill_tokens=8)
    prompts = _prompts(4, shared=6, seed=6)
    long_prompt = prompts[0] + list(range(1, 20))
    # waiting: never stepped
    h_wait = e.submit(prompts[1], SamplingParams(max_new_tokens=5))
    assert e.abort(h_wait.rid) is True
    assert h_wait.result(0).finish_reason == "abort" and e._requests[h_wait.rid].state == ABORTED
    # running, mid chunked prefill (8-token budget, 25+ token prompt)
    h_chunk = e.submit(long_prompt, SamplingParams(max_new_tokens=5))
    e.step()
    req = e._requests[h_chunk.rid]
    assert req.state == RUNNING and 0 < req.computed < len(long_prompt)
    assert e.abort(h_chunk.rid)
    _no_leak(e)
    # running, decoding
    h_dec = e.submit(prompts[2], SamplingParams(max_new_tokens=50))
    for _ in range(4):
        e.step()
    assert e._requests[h_dec.rid].state == RUNNING and len(e._requests[h_dec.rid].output_ids) >= 2
    assert e.abort(h_dec.rid)
    assert h_dec.result(0).finish_reason == "abort"
    _no_leak(e)
    # finished: nothing left to abort
    h_done = e.submit(prompts[3], SamplingParams(max_new_tokens=2))
    _drain(e)
    assert e._requests[h_done.rid].state == FINISHED
    assert e.abort(h_done.rid) is False and e.abort("no-such-rid") is False
    _no_leak(e)
    # and the engine still serves exactly
    assert e.generate([prompts[3]], SamplingParams(max_new_tokens=6))[0].token_ids == \
        reference_greedy(ref, prompts[3], 6)


@pytest.mark.parametrize("bad, message", [
    ([], "empty prompt"),
    ("", "empty prompt"),
    ([5] * 201, "does not fit a pool of 200 slots"),
    ([999], "outside the vocabulary"),
])
def test_bad_prompts_are_rejected_and_nothing_leaks(bad, message):
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=200)
    before = e.allocator.free_pages.clone()
    with pytest.raises(ValueError, match=message):
        e.submit(bad, SamplingParams(max_new_tokens=2))
    assert torch.equal(before, e.allocator.free_pages) and not e.has_work()
    assert e.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))[0].finish_reason == "length"
    _no_leak(e)


@pytest.mark.parametrize("params, message", [
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(max_new_tokens=150), "lower max_new_tokens or raise pool_slots"),
    (dict(max_new_tokens=600), "exceeds the model's context of 512 tokens"),
])
def test_bad_sampling_params(params, message):
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=100 if params.get("max_new_tokens") == 150 else 1000)
    with pytest.raises(ValueError, match=message):
        e.submit([1] * 60, SamplingParams(**params))
    _no_leak(e)


def test_bad_engine_config():
    _, runner = tiny_pair("llama")
    with pytest.raises(ValueError, match="lru, lfu, fifo, mru, filo, priority, slru"):
        Engine(runner, eviction_policy="random")
    with pytest.raises(ValueError, match="lpm, fcfs"):
        Engine(runner, schedule_policy="sjf")
    with pytest.raises(ValueError, match="raise pool_slots"):
        Engine(runner, pool_slots=0)
    with pytest.raises(ValueError, match="neither 'default', nor a local Hugging Face checkpoint"):
        Engine("/no/such/model")


def test_seeded_sampling_is_reproducible_and_differs_from_greedy():
    _, runner = tiny_pair("qwen3")
    e = Engine(runner, pool_slots=300)
    p = _prompts(1, shared=8, seed=7)[0]
    params = SamplingParams(max_new_tokens=12, temperature=1.5, top_k=50, top_p=0.9, seed=1234)
    a = e.generate([p], params)[0].token_ids
    b = e.generate([p], params)[0].token_ids
    g = e.generate([p], SamplingParams(max_new_tokens=12))[0].token_ids
    assert a == b and a != g
    _no_leak(e)


def test_eight_threads_48_requests_while_the_loop_runs():
    ref, runner = tiny_pair("llama")
    prompts = _prompts(48, shared=16, seed=8)
    alone = Engine(runner, pool_slots=2000)
    expected = [alone.generate([p], SamplingParams(max_new_tokens=6))[0].token_ids for p in prompts]
    e = Engine(runner, pool_slots=160, max_running_requests=8, max_prefill_tokens=64).start()
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            hs = [(i, e.submit(prompts[i], SamplingParams(max_new_tokens=6))) for i in range(k, 48, 8)]
            for i, h in hs:
                results[i] = h.result(timeout=120).token_ids
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    e.stop()
    assert not errors
    assert [results[i] for i in range(48)] == expected
    assert e.cache.evicted_tokens > 0  # the small pool really evicted under load
    _no_leak(e)
