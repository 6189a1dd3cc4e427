"""The official openai client against a live server on a tiny random model (prompts are token ids)."""
from __future__ import annotations

import json

import httpx

from tests.server.conftest import wait_until

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]


def test_completion_then_repeat_hits_the_cache(tiny):
    c = tiny.client()
    first = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0)
    assert first.object == "text_completion" and first.model == "tiny"
    assert first.choices[0].finish_reason == "length"
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (8, 6)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0)
    # the whole prompt is in the tree; match_prefix leaves the last token to compute its logits
    assert again.usage.prompt_tokens_details.cached_tokens == 7
    tiny.engine.check_invariants()


def test_stream_sends_chunks_usage_and_done(tiny):
    with httpx.stream("POST", f"{tiny.url}/v1/completions", timeout=30,
                      json={"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 5 and usage["prompt_tokens"] == 8
    assert "cached_tokens" in usage["prompt_tokens_details"]
    # the openai client reads the same stream
    got = list(tiny.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert got[-1].usage.completion_tokens == 5 and got[-1].usage.prompt_tokens_details.cached_tokens == 7


def test_n_and_prompt_lists_give_one_choice_each(tiny):
    c = tiny.client()
    r = c.completions.create(model="tiny", prompt=[PROMPT, PROMPT[:4]], n=2, max_tokens=3, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    # each prompt counted once however many choices it has (OpenAI, SGLang); every choice's completion
    assert r.usage.prompt_tokens == 8 + 4 and r.usage.completion_tokens == 12
    streamed = list(c.completions.create(model="tiny", prompt=PROMPT, n=3, max_tokens=2, temperature=0,
                                         stream=True))
    finishes = sorted(ch.choices[0].index for ch in streamed if ch.choices[0].finish_reason)
    assert finishes == [0, 1, 2]


def test_sampling_fields_reach_the_engine(tiny):
    c = tiny.client()
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0, top_p=0.9, seed=123,
              extra_body={"top_k": 20, "priority": 3, "ignore_eos": True, "cache_salt": "tenant-a"})
    a, b = c.completions.create(**kw), c.completions.create(**kw)
    assert a.usage.completion_tokens == b.usage.completion_tokens == 8
    # cache_salt is the radix extra_key: another tenant's identical prompt does not hit tenant-a's KV
    other = c.completions.create(**{**kw, "extra_body": {"cache_salt": "tenant-b"}})
    assert b.usage.prompt_tokens_details.cached_tokens == 7
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    snap = tiny.engine.snapshot()
    assert {n.extra_key for n in snap.cache.nodes[1:]} == {"tenant-a", "tenant-b"}


def test_models_and_health(tiny):
    models = tiny.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(f"{tiny.url}/health").json()["status"] == "ok"
    # what sglang-router asks when it registers a worker
    assert httpx.get(f"{tiny.url}/get_model_info").json()["model_path"] == "tiny"
    info = httpx.get(f"{tiny.url}/server_info").json()
    assert info["pool_slots"] == 256 and info["served_model_name"] == "tiny"


def test_client_disconnect_mid_stream_gives_every_slot_back(tiny):
    e = tiny.engine
    e.stop()        # step mode: the test decides how far the request gets, however fast the machine
    try:
        with httpx.stream("POST", f"{tiny.url}/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": PROMPT, "max_tokens": 200, "temperature": 0,
                                "stream": True}) as r:
            assert r.status_code == 200
            wait_until(lambda: tiny.host.inflight, what="the request to reach the engine")
            # a few tokens in (the tiny model has no tokenizer, so no text chunk comes before the end)
            while not any(v.state == "running" and v.output_tokens >= 3 for v in e.snapshot().requests):
                assert e.step()
            assert tiny.host.inflight
        # still in step mode, so only the disconnect can end it (a running loop would finish it in 0.3 s)
        wait_until(lambda: not tiny.host.inflight, what="the aborted request to leave")
    finally:
        e.start()
    snap = e.snapshot()
    assert snap.metrics["running"] == 0 and snap.metrics["in_use_slots"] == 0 and snap.metrics["locked_slots"] == 0
    assert snap.requests[-1].state == "aborted" and snap.requests[-1].output_tokens < 200
    e.check_invariants()
    assert e.allocator.available() + snap.cache.evictable_size == e.allocator.num_slots


def test_n_choices_from_the_largest_seed_wrap_to_seed_0(tiny):
    """Choice i samples with seed + i; from the largest seed that wraps to 0 instead of a 400 naming a
    seed the client never sent."""
    c = tiny.client()
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, extra_body={"ignore_eos": True})
    both = sorted(c.completions.create(n=2, seed=2 ** 63 - 1, **kw).choices, key=lambda ch: ch.index)
    assert both[0].text == c.completions.create(seed=2 ** 63 - 1, **kw).choices[0].text
    assert both[1].text == c.completions.create(seed=0, **kw).choices[0].text


def test_an_unexpected_exception_is_a_500_in_openai_json(tiny, monkeypatch):
    """A bug (here a fault injected into the engine's submit) still leaves as OpenAI's error JSON, without
    its message (which could quote another tenant's data)."""
    def fault(*args, **kwargs):
        raise RuntimeError("secret detail")
    monkeypatch.setattr(tiny.engine, "submit", fault)
    r = httpx.post(f"{tiny.url}/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 500 and "secret" not in r.text
    assert r.json()["error"] == {"message": "internal error (RuntimeError); the server's log has the details",
                                 "type": "server_error", "param": None, "code": "internal_error"}
