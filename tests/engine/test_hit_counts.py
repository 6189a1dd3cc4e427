"""hit_count as SGLang 0.5.23 counts it: each request adds one hit to every node of its path, at its insert
(`inserted_len`), however many chunks its prompt is prefilled in; a match counts none. lfu and slru rank by it,
so a choice made in the Capacity lab transfers to SGLang. Before, every re-match after a chunk counted: one
40-token prompt in 8-token chunks gave its first node 5 hits and slru's protected segment on first use."""
from __future__ import annotations

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from tests.tiny_models import tiny_pair

PROMPT = list(range(1, 41))


def _hits(e: Engine) -> list[tuple[int, int]]:
    return [(len(n.key), n.hit_count) for n in e.cache.nodes()[1:]]


def test_a_prompt_prefilled_in_chunks_counts_one_hit_a_node():
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=256, max_prefill_tokens=8, eviction_policy="slru")
    e.generate([PROMPT], SamplingParams(max_new_tokens=2))
    assert _hits(e) == [(8, 1), (8, 1), (8, 1), (8, 1), (8, 1), (1, 1)]    # chunks + the first output token
    e.generate([PROMPT[:20] + [99] * 4], SamplingParams(max_new_tokens=1))     # a second request, sharing 20
    assert [(len(n.key), n.hit_count) for n in e.cache.nodes()[1:] if n.hit_count == 2] == [(8, 2), (8, 2), (4, 2)]


def test_a_retracted_request_counts_its_output_once_as_in_sglang():
    """A retraction puts the request's tokens in the tree without counting: the request counts its path when it
    runs again, as in SGLang (whose retraction inserts nothing, and whose rerun inserts the output again). The
    retraction's insert had counted the output node, and the rerun again: 2 hits from one request's one run."""
    _, runner = tiny_pair("llama")
    e = Engine(runner, pool_slots=256)
    h = e.submit(PROMPT[:8], SamplingParams(max_new_tokens=12, ignore_eos=True))
    while len(h.partial_ids()) < 5:
        e.step()
    e.scheduler._retract_newest()                            # what a full pool does to the newest request
    assert _hits(e) == [(8, 1), (4, 0)]                      # prompt (its first run), output so far: not counted
    while e.has_work():
        e.step()
    assert h.result(0).retractions == 1
    assert _hits(e) == [(8, 2), (4, 1), (7, 1)]              # the rerun counts its whole path once
