"""Issue 10, item 7 and the in-batch gap: SGLang's scheduling behaviour on tiny models.

In-batch prefix sharing holds back a waiting request that shares 32+ uncached prefix tokens
with one being prefilled, so it hits the cache a step later; lpm falls back to fcfs above 128
waiting requests (where sorting starves unique prompts and costs more than it saves)."""
from __future__ import annotations

import random

import pytest

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from core.engine.scheduler import IN_BATCH_PREFIX_TOKENS, LPM_FALLBACK_WAITING, LPM_MAX_OVERTAKEN
from tests.engine_checks import still_serves
from tests.tiny_models import reference_greedy, tiny_pair


def _family(n: int, shared: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, 128) for _ in range(shared)]
    return [system + [rng.randrange(1, 128) for _ in range(rng.randrange(3, 9))] for _ in range(n)]


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("llama")


def test_eight_at_once_sharing_a_long_prefix_hit_the_cache(pair):
    ref, runner = pair
    prompts = _family(8, shared=40, seed=1)
    on = Engine(runner, pool_slots=600)
    handles = [on.submit(p, SamplingParams(max_new_tokens=6)) for p in prompts]
    on.step()
    assert len(on.scheduler.running) == 1 and len(on.scheduler.waiting) == 7   # the other 7 wait a step
    while on.has_work():
        on.step()
    got = [h.result(0) for h in handles]
    # what the tree predicts: the first computes everything and caches its prompt when its prefill
    # ends; the seven admitted together next step each find their common prefix with that prompt
    assert got[0].cached_tokens == 0
    for p, c in zip(prompts[1:], got[1:]):
        assert c.cached_tokens == _lcp(p[:-1], prompts[0]) >= 40
    assert on.scheduler.held_back == 7
    assert on.metrics.prefill_computed == sum(len(p) for p in prompts) - sum(c.cached_tokens for c in got)
    off = Engine(runner, pool_slots=600, disable_radix_cache=True).generate(prompts, SamplingParams(max_new_tokens=6))
    assert [c.token_ids for c in got] == [c.token_ids for c in off] == [reference_greedy(ref, p, 6) for p in prompts]
    assert all(c.cached_tokens == 0 for c in off)
    still_serves(on, ref)


def test_a_short_shared_prefix_is_not_worth_a_step(pair):
    """Below SGLang's 32-token threshold all are admitted together (and none hits)."""
    ref, runner = pair
    prompts = _family(6, shared=IN_BATCH_PREFIX_TOKENS - 12, seed=2)
    e = Engine(runner, pool_slots=600)
    handles = [e.submit(p, SamplingParams(max_new_tokens=3)) for p in prompts]
    e.step()
    assert len(e.scheduler.running) == 6 and e.scheduler.held_back == 0
    while e.has_work():
        e.step()
    assert [h.result(0).cached_tokens for h in handles] == [0] * 6
    still_serves(e, ref)


def test_different_namespaces_are_not_held_back(pair):
    ref, runner = pair
    prompts = _family(2, shared=40, seed=3)
    e = Engine(runner, pool_slots=600)
    a = e.submit(prompts[0], SamplingParams(max_new_tokens=2), extra_key="a")
    b = e.submit(prompts[1], SamplingParams(max_new_tokens=2), extra_key="b")
    e.step()
    assert len(e.scheduler.running) == 2 and e.scheduler.held_back == 0
    while e.has_work():
        e.step()
    assert a.result(0).cached_tokens == b.result(0).cached_tokens == 0
    still_serves(e, ref)


def _lpm_setup(runner, waiting: int):
    """A cached 30-token prefix, then a unique prompt first in the queue and `waiting` requests
    that extend the cached prefix: lpm puts those first, fcfs the unique one."""
    cached = _family(1, shared=30, seed=4)[0]
    e = Engine(runner, pool_slots=4000, max_running_requests=4)
    e.generate([cached], SamplingParams(max_new_tokens=1))
    rng = random.Random(5)
    unique = e.submit([127, 126, 125, 124], SamplingParams(max_new_tokens=1))
    for _ in range(waiting):
        e.submit(cached + [rng.randrange(1, 128) for _ in range(3)], SamplingParams(max_new_tokens=1))
    return e, unique


def test_lpm_prefers_the_longest_cached_prefix_up_to_128_waiting(pair):
    ref, runner = pair
    e, unique = _lpm_setup(runner, waiting=20)
    e.step()
    assert e.requests.get(unique.rid).state == "waiting"
    assert all(len(r.prompt_ids) == 33 for r in e.scheduler.running)
    while e.has_work():
        e.step()
    still_serves(e, ref)


def test_lpm_lets_later_arrivals_overtake_a_request_four_times_then_serves_it_first(pair):
    """A client's batch of prompts that share a cached prefix kept a lone prompt waiting until the whole batch
    was done (100 s in a probe of the server); now it waits for at most LPM_MAX_OVERTAKEN overtakes."""
    ref, runner = pair
    e, unique = _lpm_setup(runner, waiting=20)
    req = e.requests.get(unique.rid)
    e.step()                                # 4 later arrivals with the cached prefix go first (4 may run)
    assert req.state == "waiting" and req.overtaken == LPM_MAX_OVERTAKEN == 4
    def later(state: str) -> int:
        return sum(r.arrival > req.arrival and r.state == state for r in e.requests.listing()[0])

    assert later("finished") == 4 and later("waiting") == 16
    before = max(r.admit_order for r in e.requests.listing()[0])
    e.step()                                # the unique prompt first, then 3 more of them
    this_step = sorted((r for r in e.requests.listing()[0] if r.admit_order > before), key=lambda r: r.admit_order)
    assert this_step[0] is req and len(this_step) == 4 and req.state == "finished"
    assert later("finished") == 4 + 3 and later("waiting") == 13
    while e.has_work():
        e.step()
    assert unique.result(0).finish_reason == "length"
    still_serves(e, ref)


def test_lpm_falls_back_to_fcfs_above_128_waiting(pair):
    ref, runner = pair
    e, unique = _lpm_setup(runner, waiting=LPM_FALLBACK_WAITING + 1)
    e.step()    # 130 waiting: served in arrival order, so the unique prompt is not starved
    assert e.requests.get(unique.rid).state in ("running", "finished")
    assert unique.done() or e.requests.get(unique.rid) in e.scheduler.running
    while e.has_work():
        e.step()
    assert unique.result(0).finish_reason == "length"
    still_serves(e, ref)
