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
