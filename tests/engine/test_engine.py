"""The engine on tiny random models: exact greedy output with the cache, chunking, paging,
retraction, aborts at every stage, bad input, and concurrency."""
from __future__ import annotations

import random
import threading

import pytest
import torch

from core.cache.radix_cache import RadixKey
from core.engine.engine import Engine
from core.engine.request import ABORTED, FINISHED, RUNNING
from core.engine.sampling import SamplingParams, sample
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
    prompts = _prompts(5, shared=40, seed=2)
    outs = {}
    for disable in (False, True):
        e = Engine(runner, pool_slots=400, disable_radix_cache=disable)
        outs[disable] = e.generate(prompts, SamplingParams(max_new_tokens=8))
        _no_leak(e)
        if disable:
            assert e.cache.total_size() == 0 and e.allocator.available() == 400
    assert [c.token_ids for c in outs[False]] == [c.token_ids for c in outs[True]] == \
        [reference_greedy(ref, p, 8) for p in prompts]
    assert [c.cached_tokens for c in outs[True]] == [0] * 5
    # cache on: the first computes the 40-token system prompt, the other four (held back a step by
    # in-batch prefix sharing) read it from the cache: the "same tokens" above compare real hits
    on = [c.cached_tokens for c in outs[False]]
    assert on[0] == 0 and all(c >= 40 for c in on[1:])


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
    """A pool that cannot hold every running request to the end: the newest is retracted, its
    computed tokens go into the tree (the same step evicts from them only what the older request
    needs), and re-admission hits exactly what the tree still holds (its prompt at least).
    Outputs stay exact."""
    ref, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=64, max_prefill_tokens=64)
    prompts = _prompts(3, shared=0, seed=5)
    prompts = [p + [7] * (12 - len(p)) for p in prompts]  # 12 tokens each
    handles = [e.submit(p, SamplingParams(max_new_tokens=14)) for p in prompts]
    retracted = []          # the victims, each retracted at least once
    readmissions = 0
    while e.has_work():
        before = e.scheduler.retractions
        seq = e.cache.events.last_seq
        running = {r.rid: (r.computed, list(r.fill_ids[:r.computed]), set(r.kv_slots.tolist()))
                   for r in e.scheduler.running}
        # what re-admission will find: the tree's cached prefix of each retracted request, now
        peeks = {r.rid: e.cache.peek_prefix_len(RadixKey(r.fill_ids[:-1])) for r in retracted
                 if r in e.scheduler.waiting}
        seen = {r.rid: len(r.admissions) for r in retracted}
        e.step()
        e.check_invariants()
        for r in retracted:
            if len(r.admissions) > seen[r.rid]:
                assert r.admissions[-1] == peeks[r.rid] > 0     # the re-admission hit its cached tokens
                readmissions += 1
        if e.scheduler.retractions > before:
            victim = next(r for r in e.scheduler.waiting if r.rid in running)
            computed, ids, slots = running[victim.rid]
            # its computed tokens went into the tree, not back to free_pages; what is missing now is
            # exactly what the same step evicted of them to make room for the older request
            evicted = {s for ev in e.events_since(seq) if ev.kind == "evict" for s in ev.slots} & slots
            assert e.cache.peek_prefix_len(RadixKey(ids)) == computed - len(evicted) >= len(victim.prompt_ids)
            retracted.append(victim)
    assert e.scheduler.retractions >= 1 and readmissions >= e.scheduler.retractions
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
    assert h_wait.result(0).finish_reason == "abort" and e.requests.get(h_wait.rid).state == ABORTED
    # running, mid chunked prefill (8-token budget, 25+ token prompt)
    h_chunk = e.submit(long_prompt, SamplingParams(max_new_tokens=5))
    e.step()
    req = e.requests.get(h_chunk.rid)
    assert req.state == RUNNING and 0 < req.computed < len(long_prompt)
    assert e.abort(h_chunk.rid)
    _no_leak(e)
    # running, decoding
    h_dec = e.submit(prompts[2], SamplingParams(max_new_tokens=50))
    for _ in range(4):
        e.step()
    assert e.requests.get(h_dec.rid).state == RUNNING and len(e.requests.get(h_dec.rid).output_ids) >= 2
    assert e.abort(h_dec.rid)
    assert h_dec.result(0).finish_reason == "abort"
    _no_leak(e)
    # finished: nothing left to abort
    h_done = e.submit(prompts[3], SamplingParams(max_new_tokens=2))
    _drain(e)
    assert e.requests.get(h_done.rid).state == FINISHED
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
    (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0"),
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
    ref, runner = tiny_pair("qwen3")
    e = Engine(runner, pool_slots=600)
    p = _prompts(1, shared=8, seed=7)[0]
    params = SamplingParams(max_new_tokens=12, temperature=1.5, top_k=50, top_p=0.9, seed=1234)
    a = e.generate([p], params)[0].token_ids
    b = e.generate([p], params)[0].token_ids
    g = e.generate([p], SamplingParams(max_new_tokens=12))[0].token_ids
    assert a == b and a != g
    others = [e.generate([p], SamplingParams(max_new_tokens=12, temperature=1.5, seed=s))[0].token_ids
              for s in (1, 2, 3)]
    assert len({tuple(x) for x in others + [a]}) == 4        # different seeds, different samples
    _no_leak(e)


@torch.no_grad()
def _ref_logits(ref, ids: list[int]) -> torch.Tensor:
    return ref(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (0, 0.3), (5, 0.5)])
def test_every_sampled_token_is_inside_top_k_and_top_p(top_k, top_p):
    """Each token the engine samples is among the top_k most likely and inside the top_p nucleus of the stock
    model's own next-token distribution (at temperature 1.3) at that position, both measured on that whole
    distribution (SGLang's joint cut: top_p is not measured on the top_k renormalised)."""
    ref, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=800)
    prompts = _prompts(4, shared=4, seed=11)
    outs = e.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.3, top_k=top_k, top_p=top_p, seed=5))
    checked = 0
    for p, c in zip(prompts, outs):
        for i, tok in enumerate(c.token_ids):
            probs = torch.softmax(_ref_logits(ref, p + c.token_ids[:i]) / 1.3, dim=-1)
            order = torch.argsort(probs, descending=True).tolist()
            rank = order.index(tok)
            if top_k:
                assert rank < top_k
            mass_before = float(probs[order[:rank]].sum())   # the nucleus keeps tokens until the mass reaches top_p
            assert mass_before < top_p + 1e-5
            checked += 1
    assert checked == 48
    _no_leak(e)


def test_top_k_sampling_covers_exactly_the_top_k():
    """Many draws from one row: top_k=4 yields exactly the 4 largest logits, each often."""
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9, 0.0, 1.8, 1.7, -3.0]])
    params = SamplingParams(temperature=1.0, top_k=4, seed=0).frozen()
    g = params.make_generator(torch.device("cpu"))
    draws = [sample(logits, [params], [g])[0] for _ in range(400)]
    assert set(draws) == {1, 3, 5, 6}
    nucleus = SamplingParams(temperature=1.0, top_p=0.5, seed=0).frozen()
    g = nucleus.make_generator(torch.device("cpu"))
    # softmax mass: 1 -> 0.263, 3 -> 0.238, 5 -> 0.215 ...: the smallest set reaching 0.5 is {1, 3}
    assert set(sample(logits, [nucleus], [g])[0] for _ in range(400)) == {1, 3}


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


@pytest.mark.parametrize("page_size, chunk", [(1, None), (4, 3)])
def test_max_new_tokens_0_prefills_the_prompt_into_the_cache_and_generates_nothing(page_size, chunk):
    """SGLang's prefill-only request (its frontend's cache_prefix): the prompt's K/V goes into the tree, no token
    is sampled, and what runs after it is exactly what runs without it."""
    _, runner = tiny_pair("llama")
    kw = dict(pool_slots=64, page_size=page_size, **({"max_prefill_tokens": chunk} if chunk else {}))
    prefix = [5, 17, 33, 2, 90, 61, 7, 12, 40]
    e = Engine(runner, **kw)
    c = e.generate([prefix], SamplingParams(max_new_tokens=0))[0]
    assert (c.token_ids, c.finish_reason, c.text, c.ttft, c.prompt_tokens) == ([], "length", "", None, 9)
    _no_leak(e)
    assert e.cache.match_prefix(RadixKey(prefix)).indices.numel() == 9 - 9 % page_size
    after = e.generate([prefix + [3, 4]], SamplingParams(max_new_tokens=4))[0]
    assert after.cached_tokens == 9 - 9 % page_size
    cold = Engine(runner, **kw).generate([prefix + [3, 4]], SamplingParams(max_new_tokens=4))[0]
    assert after.token_ids == cold.token_ids
    _no_leak(e)
