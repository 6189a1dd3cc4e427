"""What SGLang 0.5.23 and the openai SDK's types hold the OpenAI routes to, on the default model: matched_stop on
every choice, stop strings before min_tokens, per-chunk usage, a max_tokens hint that is itself accepted,
include_obfuscation, the Responses usage shape."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from core.engine.engine import Engine
from core.server.app import ServerSettings
from tests.server.conftest import serving

PROMPT = "The capital of France is"          # greedy: " Paris.\n\nThe answer is:"


@pytest.fixture(scope="module")
def real(smollm2_runner):
    with serving(Engine(smollm2_runner, pool_slots=1024), settings=ServerSettings(model="default")) as s:
        yield s


def post(served, path: str, body: dict) -> httpx.Response:
    return httpx.post(served.url + path, json=body, timeout=60)


def chunks(served, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", served.url + path, json={**body, "stream": True}, timeout=60) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def test_every_choice_says_which_stop_ended_it_as_sglang_s_matched_stop(real):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stop": ["."]}
    choice = post(real, "/v1/completions", body).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["matched_stop"]) == (" Paris", "stop", ".")
    cut = post(real, "/v1/completions", {**body, "stop": None, "max_tokens": 2}).json()["choices"][0]
    assert (cut["finish_reason"], cut["matched_stop"]) == ("length", None)
    streamed = chunks(real, "/v1/completions", body)
    assert [c["choices"][0]["matched_stop"] for c in streamed][-1] == "."
    assert all(c["choices"][0]["matched_stop"] is None for c in streamed[:-1])
    chat = post(real, "/v1/chat/completions", {"messages": [{"role": "user", "content": "What is the capital of "
                                                             "France?"}], "max_tokens": 30, "temperature": 0,
                                               "stop": [" Paris"]}).json()["choices"][0]
    assert (chat["finish_reason"], chat["matched_stop"]) == ("stop", " Paris")


def test_a_stop_string_ends_the_answer_before_min_tokens_as_in_sglang(real):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stop": ["."], "min_tokens": 6}
    choice = post(real, "/v1/completions", body).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["matched_stop"]) == (" Paris", "stop", ".")


def test_continuous_usage_stats_puts_the_usage_so_far_on_every_chunk(real):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    got = chunks(real, "/v1/completions", body)
    final = got[-1]["usage"]
    assert got[-1]["choices"] == [] and final["completion_tokens"] == 8
    texts = got[:-1]
    counts = [c["usage"]["completion_tokens"] for c in texts]
    assert counts == sorted(counts) and counts[-1] == 8 and counts[0] >= 1
    assert all(c["usage"]["prompt_tokens"] == final["prompt_tokens"] == 5 and
               c["usage"]["total_tokens"] == 5 + c["usage"]["completion_tokens"] for c in texts)
    plain = chunks(real, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert all(c["usage"] is None for c in plain[:-1])


def test_the_max_tokens_a_refusal_suggests_is_accepted(tiny_runner):
    """The pool (1,024 slots) holds more than the model's context (512 positions): the hint is the smaller
    room (it named the pool's 1,020, and a retry with it was refused again for the context)."""
    with serving(Engine(tiny_runner, pool_slots=1024), settings=ServerSettings(model="tiny")) as s:
        ids = [5, 17, 33, 2, 9]
        err = post(s, "/v1/completions", {"prompt": ids, "max_tokens": 100_000}).json()["error"]
        most = int(err["message"].rsplit("at most ", 1)[1].replace(",", ""))
        assert most == 512 - 5
        assert post(s, "/v1/completions", {"prompt": ids, "max_tokens": most}).status_code == 200
        assert post(s, "/v1/completions", {"prompt": ids, "max_tokens": most + 1}).status_code == 400


def test_include_obfuscation_false_is_what_the_server_does_and_true_is_refused(real):
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    got = chunks(real, "/v1/completions", {**body, "stream_options": {"include_obfuscation": False}})
    assert "".join(c["choices"][0]["text"] for c in got) == " Paris." and got[-1]["choices"][0]["finish_reason"] \
        == "length" and not any("obfuscation" in c for c in got)
    r = post(real, "/v1/completions", {**body, "stream": True, "stream_options": {"include_obfuscation": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.include_obfuscation"


def test_a_responses_usage_validates_strictly_against_the_sdk_s_model(real):
    """cache_write_tokens is required (no default) in openai's InputTokensDetails."""
    out = post(real, "/v1/responses", {"input": PROMPT, "max_output_tokens": 16, "store": False}).json()
    assert out["usage"]["input_tokens_details"] == {"cached_tokens": out["usage"]["input_tokens_details"]
                                                    ["cached_tokens"], "cache_write_tokens": 0}
    openai.types.responses.Response.model_validate(out, strict=True)
