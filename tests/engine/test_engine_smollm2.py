"""The real default model (SmolLM2-135M-Instruct): the article's walkthrough slot for slot,
and greedy output with the radix cache equal to output without it."""
from __future__ import annotations

import pytest

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams

ARTICLE = ["Why my code throws errors", "Why GPU memory runs out", "Why my code is slow",
           "Why my code won't compile"]
SYSTEM = ("You are a meticulous assistant for a team that builds LLM serving systems. Answer in one short "
          "sentence, name the component involved, prefer concrete numbers, and never invent APIs. The team "
          "cares about prefix caching, KV memory, eviction policies, batching and latency.")
QUESTIONS = ["What is a KV cache?", "Why does prefix caching help?", "What is a radix tree?",
             "When is a leaf evicted?", "What does LRU mean?", "What is a slot?", "What is prefill?",
             "What is decode?", "Why lock a path?", "What is chunked prefill?", "What is a page?",
             "What is time to first token?"]


def test_article_walkthrough_on_the_real_engine(smollm2_runner):
    e = Engine(smollm2_runner, pool_slots=11)
    one = SamplingParams(max_new_tokens=1)
    assert [len(e.tokenize(p)[0]) for p in ARTICLE] == [5, 5, 5, 6]

    def run(prompt: str) -> tuple[list[int], list[tuple[int, ...]]]:
        seq = e.cache.events.last_seq
        h = e.submit(prompt, one)
        assert e.step() is True
        c = h.result(0)
        assert c.finish_reason == "length" and len(c.token_ids) == 1
        e.check_invariants()
        evs = e.events_since(seq)
        allocs = [ev.slots for ev in evs if ev.kind == "alloc"]
        evicted = [ev.slots for ev in evs if ev.kind == "evict"]
        return c.cached_tokens, allocs, evicted

    def tree() -> dict[tuple[int, ...], float]:
        s = e.snapshot().cache
        return {n.slots: n.last_access_time for n in s.nodes if n.id != s.root_id}

    assert run(ARTICLE[0]) == (0, [(1, 2, 3, 4, 5)], [])
    assert tree() == {(1, 2, 3, 4, 5): 0}
    assert run(ARTICLE[1]) == (1, [(6, 7, 8, 9)], [])
    assert tree() == {(1,): 1, (2, 3, 4, 5): 1, (6, 7, 8, 9): 1}
    assert run(ARTICLE[2]) == (3, [(10, 11)], [])
    assert tree() == {(1,): 2, (2, 3): 2, (4, 5): 2, (10, 11): 2, (6, 7, 8, 9): 1}
    assert e.snapshot().cache.free_pages == ()
    leaves = sorted(n.last_access_time for n in e.snapshot().cache.nodes if n.evictable)
    assert leaves == [1, 2, 2]
    assert e.snapshot().cache.node(e.snapshot().cache.eviction_order[0]).slots == (6, 7, 8, 9)
    # time 3: " won" and "'t" make six tokens; the least recently used leaf [6,7,8,9] goes whole
    assert run(ARTICLE[3]) == (3, [(6, 7, 8)], [(6, 7, 8, 9)])
    assert tree() == {(1,): 3, (2, 3): 3, (4, 5): 2, (10, 11): 2, (6, 7, 8): 3}
    assert e.snapshot().cache.free_pages == (9,)
    # slot 9 is free but still holds the KV of " out" until an alloc overwrites it
    pool = e.snapshot().pool
    assert e.token_piece(int(pool.slot_tokens[9])) == " out"
    assert pool.states[9] == 2  # free_stale


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_twelve_chats_sharing_a_system_prompt_same_tokens_with_and_without_cache(smollm2_runner):
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=10)
    on = Engine(smollm2_runner, pool_slots=4096)
    off = Engine(smollm2_runner, pool_slots=4096, disable_radix_cache=True)
    got_on = [on.generate([c], params)[0] for c in chats]
    got_off = [off.generate([c], params)[0] for c in chats]
    assert [c.token_ids for c in got_on] == [c.token_ids for c in got_off]
    assert all(c.cached_tokens == 0 for c in got_off)
    # what the tree predicts: the longest common prefix with any earlier prompt + output minus last token
    seen: list[list[int]] = []
    for chat, c in zip(chats, got_on):
        ids = on.tokenize(chat)[0]
        predicted = max((_lcp(ids[:-1], s) for s in seen), default=0)
        assert c.cached_tokens == predicted
        seen.append(ids + c.token_ids[:-1])
    system_len = len(on.tokenize(chats[0])[0]) - 20
    assert all(c.cached_tokens > system_len for c in got_on[1:])
    on.check_invariants()


def test_stop_string_and_streaming(smollm2_runner):
    e = Engine(smollm2_runner, pool_slots=1024)
    h = e.submit("1, 2, 3, 4, 5,", SamplingParams(max_new_tokens=20, stop=[" 8"]))
    while not h.done():
        e.step()
    c = h.result(0)
    assert c.finish_reason == "stop"
    assert c.text == " 6, 7,"
    assert "".join(h.stream(timeout=1)) == c.text
    e.check_invariants()


def test_bad_input_on_the_real_model(smollm2_runner):
    e = Engine(smollm2_runner, pool_slots=64)
    with pytest.raises(ValueError, match="empty prompt"):
        e.submit("")
    assert e.generate(["   "], SamplingParams(max_new_tokens=1))[0].prompt_tokens == 1   # whitespace is text
    with pytest.raises(ValueError, match="does not fit a pool of 64 slots; raise pool_slots"):
        e.submit("word " * 100)
    with pytest.raises(ValueError, match="'role' and 'content'"):
        e.submit([{"role": "user"}])
    assert e.generate(["Hello"], SamplingParams(max_new_tokens=2))[0].finish_reason == "length"
    e.check_invariants()


SYSTEM_118 = (SYSTEM + " Keep every answer under forty words, cite the SGLang scheduler or radix cache by name when "
              "it applies, and say when you are unsure. When a question mentions memory, give the size in GiB "
              "and in token slots; when it mentions speed, give tokens per")


def test_eight_simultaneous_chats_sharing_a_118_token_system_prompt_hit_the_cache(smollm2_runner):
    """Issue 10: all 8 submitted together. In-batch prefix sharing admits the first and holds
    the other 7 back one step, so they read the shared prefix from the cache. Greedy outputs
    equal those with the cache off."""
    chats = [[{"role": "system", "content": SYSTEM_118}, {"role": "user", "content": q}] for q in QUESTIONS[:8]]
    params = SamplingParams(max_new_tokens=8)
    on = Engine(smollm2_runner, pool_slots=4096)
    ids = [on.tokenize(c)[0] for c in chats]
    assert min(_lcp(ids[0], x) for x in ids[1:]) == 118      # the real chat template's shared prefix
    got = on.generate(chats, params)
    off = Engine(smollm2_runner, pool_slots=4096, disable_radix_cache=True).generate(chats, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in off]
    assert sum(c.cached_tokens >= 100 for c in got) >= 7
    assert [c.cached_tokens for c in got] == [0] + [_lcp(x[:-1], ids[0]) for x in ids[1:]]
    assert all(c.cached_tokens == 0 for c in off)
    on.check_invariants()
