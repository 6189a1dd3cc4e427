"""Issue 26, item 7: the smaller findings of the hostile audit, one test each."""
from __future__ import annotations

import socket
import threading
import time
import weakref

import httpx
import psutil
import pytest

from core.cache.events import MatchEvent, event_bytes
from core.engine.engine import Engine
from core.server.app import ServerSettings
from core.server.errors import APIError
from core.server.json_body import parse_object
from core.server.model_store import RunnerCache
from tests.server.conftest import serving, tiny_factory, wait_until
from tests.server.tiny_checkpoint import make_tiny_checkpoint

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]
JSON = {"Content-Type": "application/json"}


DEEP = {"at the parser's limit": b'{"prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        "where an error quotes it back": b'{"prompt": [5], "tool_choice": ' + b'{"a":' * 980 + b"1" + b"}" * 980 + b"}",
        "one level past the limit": b'{"prompt": [5], "x": ' + b"[" * 64 + b"]" * 64 + b"}"}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/generate",
                                  "/v1/tokenize", "/state/requests", "/state/rebuild", "/state/step_mode",
                                  "/state/token_bytes"])
@pytest.mark.parametrize("body", list(DEEP.values()), ids=list(DEEP))
def test_json_nested_past_64_levels_is_400_on_every_json_route(tiny, path, body):
    r = httpx.post(tiny.url + path, content=body, headers=JSON)
    assert r.status_code == 400 and "nested more than 64 levels deep" in r.json()["error"]["message"], r.text


def test_json_nested_64_levels_deep_is_read_and_one_more_is_refused_naming_the_parameter():
    x = parse_object(b'{"x": ' + b"[" * 63 + b"]" * 63 + b"}")["x"]
    for _ in range(62):
        (x,) = x
    assert x == []
    with pytest.raises(APIError, match="nested more than 64 levels deep in x;") as e:
        parse_object(b'{"x": ' + b"[" * 64 + b"]" * 64 + b"}")
    assert e.value.param == "x"


def test_a_lone_surrogate_in_a_chat_role_or_prompt_is_400_naming_the_field(tiny):
    r = httpx.post(tiny.url + "/v1/chat/completions", headers=JSON,
                   content=b'{"model": "tiny", "messages": [{"role": "\\ud800", "content": "hi"}]}')
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages" and "messages[0].role" in err["message"]
    assert "\\ud800" in err["message"]         # quoted back escaped, so the answer itself is valid UTF-8
    r = httpx.post(tiny.url + "/v1/completions", headers=JSON, content=b'{"model": "tiny", "prompt": "a\\udfffb"}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert tiny.engine.snapshot().requests == ()


def test_405_answers_say_every_method_the_path_takes(tiny):
    """Allow lists every route's methods on the path (HEAD /health and PUT /generate are routes of their own)."""
    for method, path, allow in (("GET", "/v1/completions", "POST"), ("PUT", "/v1/chat/completions", "POST"),
                                ("POST", "/v1/models", "GET"), ("POST", "/health", "GET, HEAD"),
                                ("GET", "/state/rebuild", "POST"), ("DELETE", "/generate", "POST, PUT"),
                                ("GET", "/state/requests/some-id/abort", "POST")):
        r = httpx.request(method, tiny.url + path, headers=JSON, json={})
        assert r.status_code == 405 and r.headers["allow"] == allow, (method, path)
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_max_tokens_of_a_billion_is_400_naming_max_tokens_not_the_prompt(tiny):
    r = httpx.post(tiny.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 10 ** 9})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens" and err["code"] == "context_length_exceeded"
    assert "lower max_tokens to at most 249" in err["message"]        # 8 + 249 - 1 = the pool's 256
    assert tiny.engine.snapshot().requests == ()


def test_slow_headers_get_408_and_the_connection_is_closed(tiny_runner):
    with serving(Engine(tiny_runner, pool_slots=64), settings=ServerSettings(model="tiny"), header_timeout=1.0) as s:
        port = int(s.url.rsplit(":", 1)[1])
        for first in (b"", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"):      # silent, then slowloris
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(first)
                start = time.monotonic()
                got = b""
                while chunk := sock.recv(4096):
                    got += chunk
                assert got.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 5
        assert httpx.get(s.url + "/health").status_code == 200        # the server is fine


def test_a_body_shorter_than_its_content_length_gets_408(tiny_runner):
    with serving(Engine(tiny_runner, pool_slots=64), settings=ServerSettings(model="tiny", read_timeout=1.0)) as s:
        port = int(s.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"model\": \"tiny\"")
            start = time.monotonic()
            got = b""
            while chunk := sock.recv(4096):
                got += chunk
            assert got.startswith(b"HTTP/1.1 408") and b"stopped arriving" in got
            assert time.monotonic() - start < 5


def test_one_request_with_300_prompts_holds_only_its_share_of_the_queue(tiny_runner):
    engine = Engine(tiny_runner, pool_slots=2048, max_running_requests=64)
    with serving(engine, settings=ServerSettings(model="tiny", max_queue_requests=64, max_request_share=8)) as s:
        peak = []
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak.append(len(s.host.inflight))
                time.sleep(0.002)

        threading.Thread(target=watch, daemon=True).start()
        big = {}
        t = threading.Thread(target=lambda: big.update(r=httpx.post(
            s.url + "/v1/completions", timeout=120,
            json={"model": "tiny", "prompt": [[i % 100 + 1, 7, 9] for i in range(300)], "max_tokens": 3})))
        t.start()
        wait_until(lambda: s.host.inflight, what="the big request to start")
        small = s.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2)   # gets in meanwhile
        t.join(120)
        done.set()
        assert small.usage.completion_tokens == 2
        r = big["r"]
        assert r.status_code == 200 and len(r.json()["choices"]) == 300
        assert r.json()["usage"]["completion_tokens"] == 900
        assert max(peak) <= 8 + 1          # its share, plus the small request
        assert s.host.reserved == 0 and not s.host.inflight


def test_a_full_queue_answers_503_with_retry_after(tiny_runner):
    engine = Engine(tiny_runner, pool_slots=256)
    with serving(engine, settings=ServerSettings(model="tiny", max_queue_requests=1)) as s:
        engine.stop()
        try:
            assert httpx.post(s.url + "/state/requests", json={"prompt": PROMPT}).status_code == 200
            r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "queue_full"
        finally:
            engine.start()


def test_rebuild_loads_only_models_under_the_roots_and_says_the_same_whether_a_path_exists(tmp_path, tiny_runner):
    roots = tmp_path / "models"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (roots / "link").parent.mkdir()
    (roots / "link").symlink_to(outside)
    settings = ServerSettings(model="tiny", model_roots=[str(roots)])
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 64},
                 settings=settings) as s:
        answers = set()
        for model in (str(outside), str(tmp_path / "missing"), "/etc", str(roots / "link"),
                      str(roots / ".." / "elsewhere"), str(roots) + "/\x00"):   # NUL: was a 500
            r = httpx.post(s.url + "/state/rebuild", json={"model": model})
            assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_allowed", model
            answers.add(r.json()["error"]["message"].replace(repr(model), "M"))
        assert len(answers) == 1            # nothing in the answer depends on what exists
        assert httpx.post(s.url + "/state/rebuild", json={"model": "tiny", "pool_slots": 128}).status_code == 200


def test_a_rebuild_onto_a_device_this_machine_lacks_is_400_and_the_config_keeps_its_device(tmp_path):
    folder = str(make_tiny_checkpoint(tmp_path / "tiny"))
    settings = ServerSettings(model=folder, model_roots=[str(tmp_path)])
    with serving(factory=RunnerCache(), initial_config={"model": folder, "pool_slots": 64, "device": "cpu"},
                 settings=settings) as s:
        for device in ("bogus", "cuda:7", "meta"):
            r = httpx.post(s.url + "/state/rebuild", json={"device": device}, timeout=60)
            assert r.status_code == 400 and "device" in r.json()["error"]["message"], (device, r.text)
            assert httpx.get(s.url + "/state/config").json()["device"] == "cpu"
        out = s.client().completions.create(model=folder, prompt=PROMPT, max_tokens=2, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 2


def test_a_rebuild_onto_another_model_releases_the_old_one(tmp_path):
    """Three rebuilds onto three other ~110 MB models: the first model is collected and the process does not
    grow by the models it no longer serves (it grew ~390 MB when every loaded model was kept)."""
    models = [make_tiny_checkpoint(tmp_path / f"m{i}", seed=i, hidden=512, context=1024) for i in range(4)]
    cache = RunnerCache()
    settings = ServerSettings(model=str(models[0]), model_roots=[str(tmp_path)])
    with serving(factory=cache, initial_config={"model": str(models[0]), "pool_slots": 128}, settings=settings) as s:
        def use(model) -> None:    # a forward pass touches every weight, so the model is really in memory
            out = s.client().completions.create(model=str(model), prompt=[1, 2, 3], max_tokens=2,
                                                extra_body={"ignore_eos": True})
            assert out.usage.completion_tokens == 2

        use(models[0])
        first = weakref.ref(cache.runner)
        base = psutil.Process().memory_info().rss
        for model in models[1:]:
            r = httpx.post(s.url + "/state/rebuild", json={"model": str(model)}, timeout=120)
            assert r.status_code == 200, r.text
            use(model)
        grown = (psutil.Process().memory_info().rss - base) / 2**20
        assert first() is None                     # the first model is gone, not kept in a cache
        assert cache.model == str(models[3]) and s.engine.runner is cache.runner
        assert grown < 100, f"RSS grew {grown:.0f} MB over three rebuilds"


def test_the_openapi_schema_documents_bodies_errors_content_types_and_unique_operation_ids(tiny):
    doc = httpx.get(tiny.url + "/openapi.json").json()
    ops = [(path, method, op) for path, by in doc["paths"].items() for method, op in by.items()]
    ids = [op["operationId"] for _, _, op in ops]
    assert len(ids) == len(set(ids)) == len(ops)
    schemas = doc["components"]["schemas"]
    for path, method, op in ops:
        assert {"400", "401", "403", "404", "405", "413", "415", "503"} <= set(op["responses"]), path
        assert op["responses"]["503"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ErrorResponse") or path in ("/health", "/health_generate")
        assert "422" not in op["responses"]
        body = op.get("requestBody")
        if method == "post" and path not in ("/flush_cache", "/state/step") and "abort" not in path:
            ref = body["content"]["application/json"]["schema"]["$ref"]
            assert ref.rsplit("/", 1)[1] in schemas, (path, ref)
    completion = schemas["CompletionRequest"]
    assert completion["additionalProperties"] is False and "prompt" in completion["required"]
    assert {"max_tokens", "temperature", "frequency_penalty", "logit_bias", "min_tokens"} <= set(completion["properties"])
    gen = doc["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert set(gen) == {"application/json", "text/event-stream"}
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == [
        "text/plain; version=0.0.4; charset=utf-8"]
    assert set(doc["paths"]["/flush_cache"]) == {"post"}


def test_a_load_balancer_s_head_health_check_is_answered(tiny):
    r = httpx.head(tiny.url + "/health")
    assert r.status_code == 200 and r.content == b""
    tiny.engine.stop()
    try:
        assert httpx.head(tiny.url + "/health").status_code == 503
    finally:
        tiny.engine.start()


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 1}, "cache_salt"),
    ("/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 1}, "extra_key"),
    ("/v1/responses", {"model": "tiny", "input": "hi"}, "cache_salt"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}}, "cache_salt"),
    ("/generate", {"input_ids": [PROMPT, PROMPT], "sampling_params": {"max_new_tokens": 1}}, "extra_key"),
    ("/state/requests", {"prompt": PROMPT, "params": {"max_new_tokens": 1}}, "extra_key"),
])
def test_a_cache_namespace_is_a_name_of_at_most_512_characters(tiny, path, body, param):
    """Each tree node and event of a request holds its namespace: megabytes of cache_salt per request would
    fill memory that no flush gives back."""
    r = httpx.post(tiny.url + path, json={**body, param: "s" * 513}, headers=JSON, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and f"{param} is a name of at most 512 characters, got 513" in err["message"]
    if path != "/v1/responses":         # the tiny model has no chat template
        ok = httpx.post(tiny.url + path, json={**body, param: "s" * 512}, headers=JSON, timeout=30)
        assert ok.status_code == 200, ok.text
    wait_until(lambda: not tiny.host.inflight and not tiny.host.reserved, what="the request to end")  # /state: async


def test_an_event_s_memory_estimate_counts_its_namespace():
    bare, named = (MatchEvent(seq=1, time=0.0, tokens_asked=2, tokens_hit=0, path=(3,), extra_key=k)
                   for k in (None, "n" * 5000))
    assert event_bytes(named) - event_bytes(bare) == 5000
