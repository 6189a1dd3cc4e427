"""Checks every hostile-input test ends with: nothing leaked, and the engine still serves exactly."""
from __future__ import annotations

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from tests.tiny_models import reference_greedy


def no_leak(e: Engine) -> None:
    """Idle engine: every slot is free or owned by the tree, no lock is held, the invariants hold."""
    e.check_invariants()
    assert not e.scheduler.running and not e.scheduler.waiting and not e.requests.queued()
    assert e.allocator.available() + e.cache.total_size() == e.allocator.num_slots
    assert e.cache.protected_size() == 0


def still_serves(e: Engine, ref, prompt=(3, 1, 4, 1, 5, 9, 2, 6), n: int = 5) -> None:
    """A fresh request completes with the stock model's greedy tokens, and nothing leaks after it."""
    no_leak(e)
    if e.running:
        c = e.submit(list(prompt), SamplingParams(max_new_tokens=n)).result(timeout=120)
    else:
        c = e.generate([list(prompt)], SamplingParams(max_new_tokens=n))[0]
    assert c.error is None and c.finish_reason == "length"
    assert c.token_ids == reference_greedy(ref, list(prompt), n)
    if e.running:
        e.stop()
    no_leak(e)
