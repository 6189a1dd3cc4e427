"""Issue 27, items 5-9: OpenAI's edge cases and SGLang's extensions, through the official openai client
(and raw HTTP where the shape itself is the point), on a tiny random model (prompts are token ids)."""
from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from core.engine.engine import Engine
from core.engine.sampling import SamplingParams
from core.server.app import ServerSettings
from tests.server.conftest import serving, wait_until

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]
LONG = list(range(20, 54))           # 34 tokens


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["code"], str), body      # OpenAI: a string code, never an int
    return body["error"]


def post(served, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(served.url + path, json={"model": "tiny", **body}, timeout=60)


def test_usage_counts_the_prompt_once_with_n_2(tiny):
    r = tiny.client().completions.create(model="tiny", prompt=LONG, n=2, max_tokens=3, temperature=0)
    assert len(r.choices) == 2
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (34, 6, 40)


def test_penalties_logit_bias_and_min_tokens_reach_the_sampler_through_the_openai_routes(tiny):
    kw = dict(frequency_penalty=0.9, presence_penalty=0.5, logit_bias={"7": 2.0, "11": -3.0})
    extra = {"repetition_penalty": 1.4, "min_tokens": 4}
    r = tiny.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0, **kw,
                                         extra_body=extra)
    want = Engine(tiny.engine.runner, pool_slots=256).generate(
        [PROMPT], SamplingParams(max_new_tokens=10, frequency_penalty=0.9, presence_penalty=0.5,
                                 logit_bias={7: 2.0, 11: -3.0}, repetition_penalty=1.4, min_new_tokens=4))[0]
    plain = tiny.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0)
    got = tiny.engine.request_tokens(f"{r.id}-0")["output_ids"]
    assert got == want.token_ids and got != tiny.engine.request_tokens(f"{plain.id}-0")["output_ids"]


@pytest.mark.parametrize("field,value,param", [
    ("frequency_penalty", 2.5, "frequency_penalty"), ("presence_penalty", -2.5, "presence_penalty"),
    ("repetition_penalty", 0, "repetition_penalty"), ("min_tokens", 20, "min_tokens"),
    ("logit_bias", {"128": 1}, "logit_bias"), ("logit_bias", {"5": 150}, "logit_bias"),
    ("logit_bias", {"\u00b2": 1}, "logit_bias"), ("logit_bias", {"\u0663": 1}, "logit_bias"),
    ("logit_bias", {"\uff13": 1}, "logit_bias"),
    ("temperature", 2.01, "temperature"), ("temperature", 5, "temperature"), ("max_tokens", 0, "max_tokens"),
    ("top_p", 0, "top_p"), ("n", 0, "n"), ("stop", [""], "stop"), ("seed", 2 ** 63, "seed"),
])
def test_bad_values_are_400_with_a_string_code_and_the_param_named(tiny, field, value, param):
    r = post(tiny, {"prompt": PROMPT, "max_tokens": 8, field: value})
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == param and param in err["message"], err
    assert "max_new_tokens" not in err["message"] and "min_new_tokens" not in err["message"]
    assert tiny.engine.snapshot().requests == ()


def test_temperature_two_is_accepted(tiny):
    assert post(tiny, {"prompt": PROMPT, "max_tokens": 2, "temperature": 2, "seed": 1}).status_code == 200


@pytest.mark.parametrize("field,value", [
    ("frobnicate", 1), ("tools", [{"type": "function", "function": {"name": "f"}}]), ("logprobs", True),
    ("top_logprobs", 2), ("response_format", {"type": "json_object"}), ("audio", {"voice": "x"}),
    ("modalities", ["text", "audio"]), ("reasoning_effort", "high"), ("store", True), ("service_tier", "flex"),
    ("prediction", {"type": "content", "content": "x"}), ("functions", [{"name": "f"}]), ("web_search_options", {}),
    ("min_p", 0.1), ("regex", "a+"), ("lora_path", "x"),
])
def test_every_parameter_not_honoured_is_400_naming_it(tiny, field, value):
    r = post(tiny, {"messages": [{"role": "user", "content": "hi"}], field: value}, "/v1/chat/completions")
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == field and field in err["message"], err
    assert err["code"] in ("unknown_parameter", "unsupported_parameter")


def test_completions_refuse_what_they_cannot_do_naming_it(tiny):
    # logprobs 0 asks for the sampled token's logprob ("the API will always return" it): refused as 2 is
    for field, value in (("echo", True), ("suffix", "end"), ("best_of", 3), ("logprobs", 2), ("logprobs", 0),
                         ("user_id", "x")):
        r = post(tiny, {"prompt": PROMPT, field: value})
        assert r.status_code == 400 and error_of(r)["param"] == field, (field, r.text)


def test_response_format_json_schema_is_refused_with_the_openai_parse_helper(tiny):
    class Answer(BaseModel):
        city: str

    with pytest.raises(openai.BadRequestError, match="response_format 'json_schema' is not supported") as exc:
        tiny.client().chat.completions.parse(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                             response_format=Answer)
    assert exc.value.body["param"] == "response_format"


def test_what_sglang_router_adds_when_it_forwards_is_accepted(tiny):
    # sglang-router 0.3.2 re-serialises a request with SGLang's defaults filled in (captured from its traffic)
    r = post(tiny, {"prompt": PROMPT, "max_tokens": 2, "temperature": 0.0, "stream": False, "echo": False,
                    "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
                    "return_hidden_states": False})
    assert r.status_code == 200, r.text
    r = post(tiny, {"messages": [{"role": "user", "content": "hi"}], "logprobs": False, "max_completion_tokens": 2,
                    "stream": False, "no_stop_trim": False, "ignore_eos": False, "continue_final_message": False,
                    "skip_special_tokens": True, "separate_reasoning": True, "stream_reasoning": True,
                    "return_hidden_states": False}, "/v1/chat/completions")
    assert r.status_code == 400 and "no chat template" in r.json()["error"]["message"]    # past the fields
    r = post(tiny, {"prompt": PROMPT, "no_stop_trim": True})
    assert r.status_code == 400 and error_of(r)["param"] == "no_stop_trim"


def test_no_op_values_and_peers_fields_are_accepted(tiny):
    # what SGLang's bench_serving (sglang-oai) and GuideLLM send, and OpenAI fields at their defaults
    r = post(tiny, {"prompt": PROMPT, "max_tokens": 2, "temperature": 0.0, "best_of": 1, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    "stop": None, "return_cached_tokens_details": True, "logprobs": None, "echo": False,
                    "user": "u", "metadata": {"k": "v"}, "top_k": -1, "seed": 3})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    r = post(tiny, {"prompt": PROMPT, "max_tokens": 2, "stream_options": None, "n": None, "service_tier": "auto",
                    "store": False, "suffix": None})
    assert r.status_code == 200, r.text


def test_models_retrieve_finds_the_served_model_and_404s_another(tiny):
    c = tiny.client()
    m = c.models.retrieve("tiny")
    assert (m.id, m.object, m.owned_by) == ("tiny", "model", "radixattention")
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4' not found"):
        c.models.retrieve("gpt-4")


def test_sglext_cached_tokens_details_when_asked(tiny):
    first = post(tiny, {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "return_cached_tokens_details": True})
    assert "sglext" not in first.json()               # nothing cached: SGLang sends no details
    again = post(tiny, {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "return_cached_tokens_details": True})
    body = again.json()
    assert body["sglext"] == {"cached_tokens_details": {"device": 7, "host": 0}}
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 7
    assert "sglext" not in post(tiny, {"prompt": PROMPT, "max_tokens": 3}).json()      # not asked: not sent
    with httpx.stream("POST", tiny.url + "/v1/completions", timeout=30,
                      json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "stream": True,
                            "return_cached_tokens_details": True, "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    ext = [c for c in chunks if "sglext" in c]
    assert len(ext) == 1 and ext[0]["sglext"]["cached_tokens_details"] == {"device": 7, "host": 0}
    # on the finishing chunk (SGLang's own bench_serving completions client reads choices[0] of every chunk)
    assert ext[0]["choices"][0]["finish_reason"] == "length"
    assert chunks.index(ext[0]) == len(chunks) - 2 and "usage" in chunks[-1]      # before the usage chunk


def test_stream_options_without_stream_is_400(tiny):
    r = post(tiny, {"prompt": PROMPT, "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and error_of(r)["param"] == "stream_options"
    r = post(tiny, {"prompt": PROMPT, "stream": False, "stream_options": {"include_usage": True}})
    assert r.status_code == 400


def test_an_aborted_request_answers_an_openai_error_not_200_abort(tiny):
    tiny.engine.stop()
    try:
        got = {}
        t = threading.Thread(target=lambda: got.update(r=post(tiny, {"prompt": PROMPT, "max_tokens": 50})))
        t.start()
        wait_until(lambda: tiny.host.inflight, what="the request to reach the engine")
        rid = next(iter(tiny.host.inflight))
        assert httpx.post(f"{tiny.url}/state/requests/{rid}/abort").json() == {"aborted": True}
        t.join(30)
    finally:
        tiny.engine.start()
    r = got["r"]
    err = error_of(r)
    assert r.status_code == 400 and err["code"] == "request_aborted" and rid in err["message"]


def test_an_idle_replicas_metrics_show_every_counter_at_0(tiny_runner):
    with serving(Engine(tiny_runner, pool_slots=64), settings=ServerSettings(model="tiny")) as s:
        samples = {smp.name: smp for fam in text_string_to_metric_families(httpx.get(s.url + "/metrics").text)
                   for smp in fam.samples}
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:cached_tokens_total",
                 "sglang:num_requests_total", "radix:aborted_requests_total", "radix:evicted_tokens_total",
                 "radix:evictions_total", "sglang:time_to_first_token_seconds_count",
                 "sglang:e2e_request_latency_seconds_count", "sglang:inter_token_latency_seconds_count",
                 "sglang:num_running_reqs", "sglang:num_queue_reqs"):
        assert samples[name].value == 0.0 and samples[name].labels == {"model_name": "tiny"}, name


def test_stream_usage_by_default_ends_every_stream_with_usage(tiny_runner):
    """SGLang's --stream-response-default-include-usage: bench_serving's chat client then reads the server's prompt
    length (chat template included) instead of its own count."""
    settings = ServerSettings(model="tiny", stream_usage_by_default=True)
    with serving(Engine(tiny_runner, pool_slots=64), settings=settings) as s:
        with httpx.stream("POST", s.url + "/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "stream": True}) as r:
            chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 8


@pytest.mark.parametrize("prompt", [[True, False], [1.0], [[True]], [[1, "2"]], [[1.0, 2]]],
                         ids=["bools", "float", "nested-bool", "nested-string", "nested-float"])
def test_token_ids_are_integers_not_bools_floats_or_strings(tiny, prompt):
    r = post(tiny, {"prompt": prompt, "max_tokens": 2})
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == "prompt", err
    assert tiny.engine.snapshot().requests == ()


@pytest.mark.parametrize("message,says", [
    ({"role": "bogus", "content": "hi"}, "role"), ({"role": "", "content": "hi"}, "role"),
    ({"role": "user", "content": [{"type": "text"}]}, "text as a string"),
    ({"role": "user", "content": [{"type": "text", "text": 1}]}, "text as a string"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "only text content parts"),
], ids=["unknown-role", "empty-role", "text-missing", "text-not-a-string", "image"])
def test_a_bad_chat_message_is_400_saying_what_is_wrong(tiny, message, says):
    r = post(tiny, {"messages": [message], "max_tokens": 2}, "/v1/chat/completions")
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == "messages" and says in err["message"], err


@pytest.mark.parametrize("body,param", [
    ({"prompt": PROMPT, "max_new_tokens": 2}, "max_new_tokens"), ({"prompt": PROMPT, "params": []}, "params"),
    ({"prompt": PROMPT, "params": 0}, "params"),
], ids=["top-level-sampling-field", "params-a-list", "params-zero"])
def test_the_dashboards_submit_refuses_what_it_would_have_ignored(tiny, body, param):
    r = httpx.post(tiny.url + "/state/requests", json=body, timeout=60)
    err = error_of(r)
    assert r.status_code == 400 and err["param"] == param, err
    assert httpx.post(tiny.url + "/state/requests", json={"prompt": PROMPT, "params": None}).status_code == 200
