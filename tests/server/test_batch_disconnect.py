"""A client that leaves a batch it waits on whole (no stream) aborts what is left of it, however fast its
answers arrive: the disconnect was asked only when no answer came for 0.5 s, so a batch whose requests kept
finishing ran to its end (2,000 prompts for 40 s) after its client had gone."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import wait_until

PROMPTS = [[i % 120 + 1, 5, 6, 7] for i in range(1500)]


@pytest.mark.parametrize("path, body", [
    ("/generate", {"input_ids": PROMPTS, "sampling_params": {"max_new_tokens": 120, "temperature": 0}}),
    ("/v1/completions", {"prompt": PROMPTS, "max_tokens": 120, "temperature": 0}),
])
def test_a_client_that_leaves_a_batch_aborts_the_rest_of_it(tiny, path, body):
    with pytest.raises(httpx.TimeoutException):
        httpx.post(tiny.url + path, json=body, timeout=1.0)      # leaves after 1 s, answers still arriving
    left = time.monotonic()
    wait_until(lambda: not tiny.host.inflight, timeout=30, what="the abandoned batch to leave the engine")
    assert time.monotonic() - left < 5                           # noticed at the next 0.5 s check
    done = tiny.engine.metrics.requests_finished
    time.sleep(0.6)                                               # nothing more of the batch is submitted
    snap = tiny.engine.snapshot()
    assert tiny.engine.metrics.requests_finished == done < len(PROMPTS)   # (on a busy box the client may leave
    assert not tiny.engine.has_work()                                      # before any prompt reached the engine)
    assert snap.metrics["in_use_slots"] == 0 and snap.metrics["locked_slots"] == 0
    tiny.engine.check_invariants()
