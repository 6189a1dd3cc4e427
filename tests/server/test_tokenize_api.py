"""SGLang's /v1/tokenize and /v1/detokenize: the engine's own tokenizer and chat template, as SGLang answers."""
from __future__ import annotations

import httpx
import pytest

from core.engine.engine import Engine
from core.engine.inputs import tokenize
from core.server.app import ServerSettings
from tests.server.conftest import serving

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def real(smollm2_runner):
    with serving(Engine(smollm2_runner, pool_slots=1024), settings=ServerSettings(model="default")) as s:
        yield s


def post(served, path, body, **kw):
    return httpx.post(served.url + path, json=body, timeout=30, **kw)


def test_text_and_a_chat_tokenize_as_the_engine_reads_them(real, smollm2_runner):
    tok = smollm2_runner.tokenizer
    r = post(real, "/v1/tokenize", {"prompt": "Hello world"}).json()
    assert r == {"tokens": tok("Hello world")["input_ids"], "count": 2, "max_model_len": 8192}
    r = post(real, "/tokenize", {"model": "default", "prompt": ["Hello", "Hello world"]}).json()
    assert r["tokens"] == [tok("Hello")["input_ids"], tok("Hello world")["input_ids"]] and r["count"] == [1, 2]
    chat = post(real, "/v1/tokenize", {"messages": CHAT}).json()
    assert chat["tokens"] == tokenize(tok, len(tok), CHAT)[0]
    served = httpx.post(real.url + "/v1/chat/completions", timeout=60,
                        json={"messages": CHAT, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert chat["count"] == served == len(chat["tokens"])          # what a chat completion counts as its prompt
    bare = post(real, "/v1/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()
    assert tok.decode(chat["tokens"][len(bare["tokens"]):]) == "<|im_start|>assistant\n"


def test_detokenize_gives_the_text_back_with_or_without_special_tokens(real, smollm2_runner):
    tok = smollm2_runner.tokenizer
    ids = post(real, "/v1/tokenize", {"messages": CHAT}).json()["tokens"]
    assert post(real, "/v1/detokenize", {"tokens": ids, "skip_special_tokens": False}).json() == {"text": tok.decode(ids)}
    both = post(real, "/detokenize", {"tokens": [ids[:3], [19556, 905, 2]]}).json()
    assert both == {"text": [tok.decode(ids[:3], skip_special_tokens=True), "Hello world"]}
    assert post(real, "/v1/detokenize", {"tokens": []}).json() == {"text": ""}


@pytest.mark.parametrize("path, body, status, param, message", [
    ("/v1/tokenize", {"prompt": "x", "messages": CHAT}, 400, "prompt", "send exactly one of prompt"),
    ("/v1/tokenize", {}, 400, "prompt", "send exactly one of prompt"),
    ("/v1/tokenize", {"messages": []}, 400, "messages", "messages is empty"),
    ("/v1/tokenize", {"prompt": 5}, 400, "prompt", "prompt"),
    ("/v1/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens", "add_special_tokens"),
    ("/v1/tokenize", {"prompt": ["x"] * 2049}, 400, "prompt", "2,049 prompts in one request; at most 2,048"),
    ("/v1/tokenize", {"prompt": "x", "model": "gpt-4"}, 404, "model", "model 'gpt-4' not found"),
    ("/v1/tokenize", {"prompt": "x", "colour": 1}, 400, "colour", "unknown parameter 'colour'"),
    ("/v1/detokenize", {"tokens": [49152]}, 400, "tokens", "token id 49152 is outside the vocabulary (0..49151)"),
    ("/v1/detokenize", {"tokens": [[1], [-1]]}, 400, "tokens", "token id -1 is outside the vocabulary"),
    ("/v1/detokenize", {"tokens": [1.5]}, 400, "tokens", "tokens"),
    ("/v1/detokenize", {"tokens": [True]}, 400, "tokens", "tokens"),
])
def test_bad_bodies_are_answered_with_the_field_to_change(real, path, body, status, param, message):
    r = post(real, path, body)
    err = r.json()["error"]
    assert r.status_code == status and err["param"] == param and message in err["message"], err


def test_a_model_without_a_tokenizer_says_so_and_a_keyed_server_wants_its_key(tiny_runner):
    from tests.server.conftest import tiny_factory
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny", api_key="k")) as s:
        assert post(s, "/v1/tokenize", {"prompt": "x"}).status_code == 401
        r = post(s, "/v1/tokenize", {"prompt": "x"}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 400 and "this model has no tokenizer" in r.json()["error"]["message"]
        r = post(s, "/v1/detokenize", {"tokens": [1]}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 400 and "this model has no tokenizer" in r.json()["error"]["message"]


@pytest.mark.parametrize("field, text_of", [
    ("prompt", lambda n: "a " * (n // 2 + 1)),
    ("prompt", lambda n: ["a " * (n // 4 + 1)] * 2),               # each fits; together they could not
    ("messages", lambda n: [{"role": "user", "content": "a " * (n // 2 + 1)}]),
])
def test_text_no_prompt_could_hold_is_refused_unread_as_on_the_generation_routes(real, field, text_of):
    """Megabytes of text would hold a worker the generation routes share for a minute: refused by its length."""
    limit = real.host.char_limit(real.engine)
    r = post(real, "/v1/tokenize", {field: text_of(limit)})
    assert r.status_code == 400 and r.elapsed.total_seconds() < 5, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (field, "context_length_exceeded")
    assert f"more than any prompt this engine can hold ({limit:,} at most" in err["message"]
    fits = post(real, "/v1/tokenize", {"prompt": "a " * (limit // 4)})
    assert fits.status_code == 200 and fits.json()["count"] == limit // 4 + 1      # the trailing space too


def test_a_messages_text_parts_reach_the_model_joined_with_a_space_as_sglang_joins_them(real, smollm2_runner):
    """["Hello", "world"] as parts is "Hello world" to the template (joined with nothing: "Helloworld"), on
    the chat route and the Responses API alike."""
    tok = smollm2_runner.tokenizer
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}]
    want = tokenize(tok, len(tok), [{"role": "user", "content": "Hello world"}])[0]
    assert post(real, "/v1/tokenize", {"messages": parts}).json()["tokens"] == want
    chat = post(real, "/v1/chat/completions", {"messages": parts, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == len(want)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hello"},
                                          {"type": "input_text", "text": "world"}]}]
    resp = post(real, "/v1/responses", {"input": items, "max_output_tokens": 16, "store": False}).json()
    assert resp["usage"]["input_tokens"] == len(want)
