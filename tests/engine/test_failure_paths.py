"""A failure inside the engine's own bookkeeping (a tree walk, a free, a policy hook) fails one request and
loses nothing: the slots it held go back exactly once, its lock is let go, its caller hears the end."""
from __future__ import annotations

import pytest

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from tests.engine_checks import no_leak, still_serves
from tests.tiny_models import tiny_pair


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("llama")


class Fault(RuntimeError):
    pass


def test_a_failure_right_after_a_chunk_enters_the_tree_frees_only_the_requests_own_slots(pair, monkeypatch):
    """The chunk's insert gives its slots to the tree; the walk after it raises. The request ends with the
    error and releases kv_slots past what the tree now owns: no slot is owned twice (before, the tree's
    slots were freed too, and the next request overwrote cached KV)."""
    ref, runner = pair
    e = Engine(runner, pool_slots=200, max_prefill_tokens=4)
    cache = e.cache
    real_insert, real_match = cache.insert, cache.match_prefix
    armed = []

    def insert(*args, **kwargs):
        got = real_insert(*args, **kwargs)
        armed.append(True)                       # the walk right after this insert fails
        return got

    def match_prefix(*args, **kwargs):
        if armed:
            armed.clear()
            monkeypatch.setattr(cache, "insert", real_insert)
            monkeypatch.setattr(cache, "match_prefix", real_match)
            raise Fault("walk failed")
        return real_match(*args, **kwargs)

    monkeypatch.setattr(cache, "insert", insert)
    monkeypatch.setattr(cache, "match_prefix", match_prefix)
    h = e.submit(list(range(20, 40)), SamplingParams(max_new_tokens=4))
    while e.step():
        pass
    c = h.result(0)
    assert c.finish_reason == "abort" and c.error == "Fault: walk failed"
    assert cache.total_size() == 4               # the chunk the tree took stays cached, its slots its own
    still_serves(e, ref)


def test_an_abort_whose_free_fails_still_ends_the_request_and_lets_go_of_its_path(pair, monkeypatch):
    """allocator.free raising mid-abort (it refuses a double free and changes nothing) used to leave the
    request's path locked for good and its caller waiting forever."""
    _, runner = pair
    e = Engine(runner, pool_slots=200)
    e.generate([[5, 6, 7, 8, 9, 10]], SamplingParams(max_new_tokens=2))
    h = e.submit([5, 6, 7, 8, 9, 10, 11, 12], SamplingParams(max_new_tokens=50))
    e.step()
    assert e.cache.protected_size() > 0           # the running request holds its cached path
    real_free = e.allocator.free

    def free(slots):
        monkeypatch.setattr(e.allocator, "free", real_free)
        raise Fault("free failed")

    monkeypatch.setattr(e.allocator, "free", free)
    with pytest.raises(Fault):
        e.abort(h.rid)
    c = h.result(0)                               # ended at once: no wait
    assert c.finish_reason == "abort"
    assert e.cache.protected_size() == 0 and not e.scheduler.running
    e.check_invariants()


def test_a_policy_hook_that_raises_mid_eviction_loses_no_slot(pair, monkeypatch):
    """The evicted leaf's slots go back before the policy hears of it: a hook that raises (the learned
    policies train in theirs) fails the request that needed the room, and the pool stays whole."""
    ref, runner = pair
    e = Engine(runner, pool_slots=48)
    for first in (10, 40, 70):                     # three cached prompts fill most of the pool
        e.generate([list(range(first, first + 12))], SamplingParams(max_new_tokens=1))
    policy = e.cache.policy
    real_hook = policy.on_evict

    def on_evict(node):
        monkeypatch.setattr(policy, "on_evict", real_hook)
        raise Fault("hook failed")

    monkeypatch.setattr(policy, "on_evict", on_evict)
    h = e.submit(list(range(90, 120)), SamplingParams(max_new_tokens=2))
    while e.step():
        pass
    assert h.result(0).error == "Fault: hook failed"
    no_leak(e)
    assert e.allocator.available() + e.cache.total_size() == 48
    still_serves(e, ref)
