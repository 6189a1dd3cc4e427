"""Every error the server returns, in OpenAI's JSON, through the official client's exception types."""
from __future__ import annotations

import json
import socket

import httpx
import openai
import pytest

from core.engine.engine import Engine
from core.server.app import ServerSettings
from tests.server.conftest import serving, wait_until

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]


@pytest.mark.parametrize("field,value,words", [
    ("temperature", -1, "temperature must be >= 0"),
    ("top_p", 0, "top_p must be in (0, 1]"),
    ("max_tokens", 0, "max_tokens must be an integer >= 1"),
    ("max_tokens", "8", "max_tokens must be an integer >= 1"),
    ("top_k", -3, "top_k must be an integer >= 0"),
    ("stop", [""], "non-empty strings"),
    ("n", 0, "n must be an integer from 1 to 16"),
    ("logprobs", 2, "logprobs are not supported"),
])
def test_bad_parameters_are_400_with_the_engines_message(tiny, field, value, words):
    r = httpx.post(f"{tiny.url}/v1/completions", json={"model": "tiny", "prompt": PROMPT, field: value})
    assert r.status_code == 400
    assert words in _error(r)["message"]
    assert not tiny.host.inflight and tiny.engine.snapshot().metrics["waiting"] == 0


def test_bad_bodies_and_prompts_are_400(tiny):
    c = tiny.client()
    for prompt, words in (([], "prompt is empty"), ([500], "outside the vocabulary"), ("text", "no tokenizer")):
        with pytest.raises(openai.BadRequestError, match=words):
            c.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(f"{tiny.url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in _error(r)["message"]
    r = httpx.post(f"{tiny.url}/v1/completions", content=b"\xff\xfe\x00garbage",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    for body, kind in ((b"null", "null"), (b"[1]", "array"), (b"true", "boolean"), (b'"x"', "string"), (b"3", "number")):
        r = httpx.post(f"{tiny.url}/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and _error(r)["message"] == f"the body must be a JSON object, got a JSON {kind}"
    r = httpx.post(f"{tiny.url}/v1/chat/completions", json={"model": "tiny", "messages": "hello"})
    assert r.status_code == 400 and "messages" in _error(r)["message"]
    # nothing was queued by any of these
    assert tiny.engine.snapshot().requests == ()


def test_unknown_model_and_route_are_404(tiny):
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4' not found; this server serves 'tiny'"):
        tiny.client().completions.create(model="gpt-4", prompt=PROMPT)
    r = httpx.get(f"{tiny.url}/v1/nowhere")
    assert r.status_code == 404 and _error(r)["type"] == "invalid_request_error"     # OpenAI's type for it


def test_api_key_guards_every_route_but_health(tiny_runner):
    with serving(Engine(tiny_runner, pool_slots=64), settings=ServerSettings(api_key="s3cret", model="tiny")) as s:
        assert httpx.get(f"{s.url}/health").status_code == 200
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                             ("GET", "/metrics"), ("POST", "/flush_cache"), ("GET", "/state/version"),
                             ("GET", "/state/snapshot"), ("GET", "/state/events"), ("POST", "/state/step")):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                r = httpx.request(method, s.url + path, headers=headers, json={})
                assert r.status_code == 401, (method, path, headers)
                assert "--api-key" in _error(r)["message"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0).models.list()
        ok = s.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
        assert ok.usage.completion_tokens == 2


def test_a_body_over_the_limit_is_413_and_a_prompt_over_the_pool_is_400_context_length_exceeded(tiny_runner):
    """A prompt too long is OpenAI's (and SGLang's) 400 context_length_exceeded, which clients catch as
    BadRequestError; it was 413, which the openai client raises as a bare APIStatusError."""
    with serving(Engine(tiny_runner, pool_slots=64),
                 settings=ServerSettings(model="tiny", max_body_bytes=2000)) as s:
        r = httpx.post(f"{s.url}/v1/completions", json={"model": "tiny", "prompt": [1] * 1000})
        assert r.status_code == 413 and "limit of 2,000" in _error(r)["message"]
        def chunks():   # no Content-Length: the limit is enforced while reading
            yield b'{"model": "tiny", "prompt": ['
            for _ in range(800):    # 2,400 bytes: over the limit (500 were 1,530 bytes, under it: the 413
                yield b"1, "        # then came from the pool check)
            yield b"1]}"
        r = httpx.post(f"{s.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "over the server's limit of 2,000 bytes" in _error(r)["message"]
        with pytest.raises(openai.BadRequestError, match="does not fit a pool of 64 slots") as exc:
            s.client().completions.create(model="tiny", prompt=[3] * 80, max_tokens=2)
        assert exc.value.status_code == 400 and exc.value.body["code"] == "context_length_exceeded"
        # the prompt fits; max_tokens is what to change: 400 naming it (not 413 naming the prompt)
        with pytest.raises(openai.BadRequestError, match="more than the pool's 64; lower max_tokens") as exc:
            s.client().completions.create(model="tiny", prompt=[3] * 40, max_tokens=40)
        assert exc.value.body["param"] == "max_tokens"
        assert s.client().completions.create(model="tiny", prompt=[3] * 40, max_tokens=4).usage.completion_tokens == 4


def test_queue_limit_is_503_and_frees_when_requests_finish(tiny_runner):
    engine = Engine(tiny_runner, pool_slots=256)
    with serving(engine, settings=ServerSettings(model="tiny", max_queue_requests=2)) as s:
        engine.stop()   # step mode: what is submitted stays in flight until we step
        sent = [httpx.post(f"{s.url}/state/requests", json={"prompt": PROMPT, "params": {"max_new_tokens": 2}})
                for _ in range(2)]
        assert [r.status_code for r in sent] == [200, 200]
        with pytest.raises(openai.APIStatusError, match="--max-queue-requests 2") as exc:
            s.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
        assert exc.value.status_code == 503
        while engine.step():
            pass
        # a finished request's route gives its position back just after the request leaves the engine
        wait_until(lambda: not s.host.inflight and s.host.reserved == 0, what="the queue to drain")
        engine.start()
        assert s.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2


def test_a_client_that_gives_up_on_a_whole_answer_aborts_it(tiny):
    """A client that closes its connection while it waits for a whole (not streamed) answer: the request it
    started is aborted before it generates a token, and every slot comes back."""
    tiny.engine.stop()      # step mode: the request cannot finish before the client gives up, however fast
    try:
        body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 240, "temperature": 0}).encode()
        port = int(tiny.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_until(lambda: tiny.host.inflight, what="the request to reach the engine")
            rid = next(iter(tiny.host.inflight))
        wait_until(lambda: not tiny.host.inflight, timeout=10, what="the abandoned request to be aborted")
        view = tiny.engine.snapshot().requests[-1]
        assert (view.rid, view.state, view.output_tokens) == (rid, "aborted", 0)
        assert tiny.engine.allocator.available() == tiny.engine.allocator.num_slots
        tiny.engine.check_invariants()
    finally:
        tiny.engine.start()
