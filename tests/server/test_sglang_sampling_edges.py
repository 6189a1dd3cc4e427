"""Sampling values SGLang 0.5.23 accepts and this server had refused or read differently: negative seeds (any
int64), `spaces_between_special_tokens: false` (a no-op while special tokens are skipped), and an open-ended
`max_new_tokens` with a larger `min_new_tokens` (clipped to the room, as SGLang's init_req_max_new_tokens)."""
from __future__ import annotations

import httpx


PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]


def generate(tiny, sampling_params: dict) -> dict:
    r = httpx.post(f"{tiny.url}/generate", json={"input_ids": PROMPT, "sampling_params": sampling_params},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_negative_seed_is_taken_and_reproducible_on_both_apis(tiny):
    sampled = {"temperature": 1.0, "max_new_tokens": 6, "ignore_eos": True}
    a = generate(tiny, {**sampled, "sampling_seed": -5})["output_ids"]
    assert a == generate(tiny, {**sampled, "sampling_seed": -5})["output_ids"]
    assert generate(tiny, {**sampled, "sampling_seed": -2 ** 63})["output_ids"]
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": -1, "n": 2}
    r = httpx.post(f"{tiny.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2


def test_spaces_between_special_tokens_false_is_accepted_and_changes_nothing(tiny):
    base = {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0}
    assert (generate(tiny, {**base, "spaces_between_special_tokens": False})["output_ids"]
            == generate(tiny, base)["output_ids"])
    r = httpx.post(f"{tiny.url}/v1/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 3, "spaces_between_special_tokens": False})
    assert r.status_code == 200, r.text


def test_an_open_ended_request_clips_min_new_tokens_to_its_room(tiny):
    got = generate(tiny, {"max_new_tokens": None, "min_new_tokens": 10 ** 6, "ignore_eos": True})
    room = got["meta_info"]["completion_tokens"]
    assert got["meta_info"]["finish_reason"] == {"type": "length", "length": room}
    assert room + len(PROMPT) - 1 == tiny.engine.allocator.num_slots            # the whole pool's room
    alone = generate(tiny, {"max_new_tokens": None, "ignore_eos": True})["meta_info"]["completion_tokens"]
    assert alone == room
