"""SGLang's native /generate and /abort_request on a tiny random model (prompts are token ids, texts empty);
/health_generate: test_health_generate.py."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from core.engine.sampling import SamplingParams
from core.server.app import ServerSettings
from tests.server.conftest import serving, tiny_factory, wait_until

PROMPT = [5, 17, 33, 2, 90, 61, 7, 12]
# what SGLang's bench_serving (--backend sglang, its default) sends, field for field
BENCH_SERVING = {"sampling_params": {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}, "stream": True,
                 "lora_path": None, "return_logprob": False, "return_routed_experts": False, "logprob_start_len": -1}


def generate(tiny, body: dict, status: int = 200):
    r = httpx.post(f"{tiny.url}/generate", json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def alone(tiny, ids: list[int], **params) -> list[int]:
    """The engine's own greedy tokens for `ids`, submitted directly."""
    return tiny.engine.submit(ids, SamplingParams(**params)).result(60).token_ids


def stream_chunks(tiny, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{tiny.url}/generate", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(ln[6:]) for ln in lines[:-1]]


def test_generate_answers_sglang_s_object_and_a_repeat_hits_the_cache(tiny):
    want = alone(tiny, PROMPT, max_new_tokens=6)
    first = generate(tiny, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert set(first) == {"text", "output_ids", "meta_info"} and first["output_ids"] == want
    meta = first["meta_info"]
    assert meta["id"].startswith("gen-") and meta["e2e_latency"] > 0
    # the prompt was cached by the direct run above; match_prefix leaves the last token to compute its logits
    assert {k: meta[k] for k in ("finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                                 "weight_version")} == {"finish_reason": {"type": "length", "length": 6},
                                                        "prompt_tokens": 8, "completion_tokens": 6,
                                                        "cached_tokens": 7, "weight_version": "default"}
    assert httpx.post(f"{tiny.url}/flush_cache").status_code == 200
    cold = generate(tiny, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert cold["output_ids"] == want and cold["meta_info"]["cached_tokens"] == 0
    tiny.engine.check_invariants()


def test_sglang_s_default_sampling_is_128_tokens_at_temperature_1(tiny):
    out = generate(tiny, {"input_ids": PROMPT, "sampling_params": {"ignore_eos": True}})
    assert out["meta_info"]["completion_tokens"] == 128
    seeded = {"input_ids": PROMPT, "sampling_params": {"ignore_eos": True, "max_new_tokens": 12, "sampling_seed": 7}}
    assert generate(tiny, seeded)["output_ids"] == alone(tiny, PROMPT, max_new_tokens=12, ignore_eos=True,
                                                          temperature=1.0, seed=7)


def test_max_new_tokens_null_runs_to_the_end_of_the_pool(tiny):
    """SGLang runs a null max_new_tokens to the end of the room; here the pool of 256 slots holds 8 + 249 - 1."""
    out = generate(tiny, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": None, "ignore_eos": True}})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 249}


def test_a_batch_with_n_answers_a_list_prompt_by_prompt_and_sample_by_sample(tiny):
    short = PROMPT[:4]
    out = generate(tiny, {"input_ids": [PROMPT, short], "sampling_params": {"max_new_tokens": 3, "temperature": 0,
                                                                          "n": 2}})
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [8, 8, 4, 4]
    assert [o["output_ids"] for o in out] == [alone(tiny, PROMPT, max_new_tokens=3)] * 2 + \
        [alone(tiny, short, max_new_tokens=3)] * 2
    assert len({o["meta_info"]["id"] for o in out}) == 4 and all("index" not in o for o in out)
    one_each = generate(tiny, {"input_ids": [PROMPT, short], "sampling_params": [{"max_new_tokens": 2},
                                                                                {"max_new_tokens": 5}]})
    assert [o["meta_info"]["completion_tokens"] for o in one_each] == [2, 5]


def test_sglang_router_s_forwarded_body_is_accepted_and_the_model_field_ignored(tiny):
    """sglang-router 0.3.2 forwards /generate with these fields added (captured from the router)."""
    router_adds = {"model": None, "return_text_in_logprobs": False, "log_metrics": True, "return_hidden_states": False,
                   "background": False, "no_logs": False, "return_bytes": False, "return_entropy": False}
    out = generate(tiny, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
                          "stream": False, **router_adds})
    assert out["output_ids"] == alone(tiny, PROMPT, max_new_tokens=2)
    for name in ("tiny", "meta-llama/Llama-3-8B"):      # SGLang's /generate ignores the model field
        assert generate(tiny, {"input_ids": PROMPT, "model": name, "sampling_params": {"max_new_tokens": 2}}
                        )["meta_info"]["completion_tokens"] == 2


def test_a_stream_ends_each_answer_with_its_finish_reason_then_done(tiny):
    chunks = stream_chunks(tiny, {"input_ids": [PROMPT, PROMPT[:4]], "return_prompt_token_ids": True,
                                  "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    last = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"] is not None}
    assert sorted(last) == [0, 1]
    assert last[0]["output_ids"] == alone(tiny, PROMPT, max_new_tokens=4)
    assert last[1]["prompt_token_ids"] == PROMPT[:4] and last[1]["meta_info"]["completion_tokens"] == 4


def test_bench_serving_s_exact_body_is_accepted(tiny):
    chunks = stream_chunks(tiny, {"input_ids": PROMPT, **BENCH_SERVING})
    assert chunks[-1]["meta_info"]["completion_tokens"] == 5 and "index" not in chunks[-1]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


@pytest.mark.parametrize("body, param, code", [
    ({"input_ids": PROMPT, "bogus": 1}, "bogus", "unknown_parameter"),
    ({"input_ids": PROMPT, "sampling_params": {"max_tokens": 5}}, "sampling_params.max_tokens", "unknown_parameter"),
    ({"input_ids": PROMPT, "text": "hi"}, "text", "invalid_value"),
    ({"sampling_params": {}}, "text", "invalid_value"),
    ({"input_ids": []}, "input_ids", "invalid_value"),
    ({"input_ids": [1, True]}, "input_ids", "invalid_value"),
    ({"input_ids": [1, 2.0]}, "input_ids", "invalid_value"),
    ({"input_ids": PROMPT, "return_logprob": True}, "return_logprob", "unsupported_parameter"),
    ({"input_ids": PROMPT, "rid": "mine"}, "rid", "unsupported_parameter"),
    ({"input_ids": PROMPT, "lora_path": "adapter"}, "lora_path", "unsupported_parameter"),
    ({"input_ids": PROMPT, "sampling_params": {"regex": "a+"}}, "sampling_params.regex", "unsupported_parameter"),
    ({"input_ids": PROMPT, "sampling_params": {"stop_token_ids": [3]}}, "sampling_params.stop_token_ids",
     "unsupported_parameter"),
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens",
     "invalid_value"),
    ({"input_ids": PROMPT, "return_logprob": [False, True]}, "return_logprob", "unsupported_parameter"),
    ({"input_ids": [PROMPT, PROMPT], "extra_key": ["a"]}, "extra_key", "invalid_value"),
    ({"input_ids": PROMPT, "extra_key": "a", "cache_salt": "b"}, "cache_salt", "invalid_value"),
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": "5"}}, "sampling_params.max_new_tokens",
     "invalid_value"),
    ({"input_ids": PROMPT, "sampling_params": {"temperature": None, "top_p": 0}}, "sampling_params.top_p",
     "invalid_value"),
    ({"input_ids": PROMPT, "sampling_params": {"sampling_seed": 2 ** 63}}, "sampling_params.sampling_seed",
     "invalid_value"),
    ({"input_ids": PROMPT, "sampling_params": {"n": 17}}, "sampling_params.n", "invalid_value"),
    ({"input_ids": PROMPT, "sampling_params": [{}]}, "sampling_params", "invalid_value"),
    ({"input_ids": [PROMPT, PROMPT], "sampling_params": [{}]}, "sampling_params", "invalid_value"),
    ({"input_ids": [PROMPT, PROMPT], "sampling_params": [{"n": 2}, {}]}, "sampling_params.n", "invalid_value"),
    ({"input_ids": PROMPT, "priority": "high"}, "priority", "invalid_value"),
    ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 300}}, "sampling_params.max_new_tokens",
     "context_length_exceeded"),
    ({"input_ids": [PROMPT, [1] * 300]}, "input_ids", "context_length_exceeded"),
    ({"input_ids": [1, 100_000]}, "input_ids", "invalid_request"),
    ({"input_ids": PROMPT, "sampling_params": {"logit_bias": {"500": 1}}}, "sampling_params.logit_bias",
     "invalid_value"),
])
def test_a_bad_body_is_a_400_naming_the_field_and_leaks_nothing(tiny, body, param, code):
    err = generate(tiny, body, 400)["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err
    assert not tiny.host.inflight and tiny.host.reserved == 0
    tiny.engine.check_invariants()
    assert tiny.engine.snapshot().metrics["locked_slots"] == 0


def test_sglang_s_off_values_of_top_k_and_its_ignored_fields_are_accepted(tiny):
    want = alone(tiny, PROMPT, max_new_tokens=3)
    for top_k in (-1, 1 << 30):
        out = generate(tiny, {"input_ids": PROMPT, "log_metrics": False, "custom_labels": {"team": "a"},
                              "sampling_params": {"max_new_tokens": 3, "temperature": 0, "top_k": top_k,
                                                  "stream_interval": 4, "skip_special_tokens": True}})
        assert out["output_ids"] == want


def test_put_is_generate_too_and_a_non_object_body_is_refused(tiny):
    r = httpx.put(f"{tiny.url}/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 2
    r = httpx.post(f"{tiny.url}/generate", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_an_aborted_stream_ends_with_what_it_had_and_sglang_s_abort_reason(tiny):
    """SGLang answers a request its owner aborted with its partial output and finish_reason "abort"."""
    e = tiny.engine
    e.stop()     # step mode: the request is still running when the abort comes
    try:
        with httpx.stream("POST", f"{tiny.url}/generate", timeout=30,
                          json={"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 200}}) as r:
            wait_until(lambda: tiny.host.inflight, what="the request to reach the engine")
            rid = next(iter(tiny.host.inflight))
            for _ in range(4):
                assert e.step()
            assert httpx.post(f"{tiny.url}/abort_request", json={"rid": rid}).json() == {"aborted": 1}
            e.step()
            lines = [ln for ln in r.iter_lines() if ln]
    finally:
        e.start()
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][6:])
    assert last["meta_info"]["id"] == rid and last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] == len(last["output_ids"]) == 4
    wait_until(lambda: not tiny.host.inflight, what="the aborted request to leave")
    e.check_invariants()


def test_a_client_that_leaves_mid_stream_gives_every_slot_back(tiny):
    e = tiny.engine
    e.stop()        # step mode: the test decides how far the request gets, however fast the machine
    try:
        with httpx.stream("POST", f"{tiny.url}/generate", timeout=30,
                          json={"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 200}}) as r:
            assert r.status_code == 200
            wait_until(lambda: tiny.host.inflight, what="the request to reach the engine")
            while not any(v.state == "running" and v.output_tokens >= 3 for v in e.snapshot().requests):
                assert e.step()
        # still in step mode, so only the disconnect can end it (a running loop would finish it in 0.3 s)
        wait_until(lambda: not tiny.host.inflight, what="the abandoned request to leave")
    finally:
        e.start()
    snap = e.snapshot()
    assert snap.requests[-1].state == "aborted" and snap.requests[-1].output_tokens < 200
    assert snap.metrics["in_use_slots"] == 0 and snap.metrics["locked_slots"] == 0
    e.check_invariants()


def test_keys_guard_generate_and_abort_but_not_the_health_check(tiny_runner):
    settings = ServerSettings(model="tiny", api_key="k1")
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 64},
                 settings=settings) as s:
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(f"{s.url}/generate", json=body).status_code == 401
        assert httpx.post(f"{s.url}/abort_request", json={"abort_all": True}).status_code == 401
        assert httpx.get(f"{s.url}/health_generate", timeout=30).status_code == 200   # SGLang's: no key
        auth = {"Authorization": "Bearer k1"}
        assert httpx.post(f"{s.url}/generate", json=body, headers=auth).status_code == 200



def test_max_new_tokens_0_caches_the_prompt_as_sglang_s_frontend_asks_and_openai_s_routes_refuse_it(tiny):
    assert httpx.post(f"{tiny.url}/flush_cache").status_code == 200
    out = generate(tiny, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 0}})
    assert (out["output_ids"], out["meta_info"]["finish_reason"]) == ([], {"type": "length", "length": 0})
    again = generate(tiny, {"input_ids": PROMPT + [3], "sampling_params": {"max_new_tokens": 1}})
    assert again["meta_info"]["cached_tokens"] == 8
    err = httpx.post(f"{tiny.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 0}).json()["error"]
    assert (err["param"], err["code"]) == ("max_tokens", "invalid_value")


def test_per_prompt_namespaces_and_lists_of_off_values_are_read_as_sglang_reads_them(tiny):
    assert httpx.post(f"{tiny.url}/flush_cache").status_code == 200
    body = {"input_ids": [PROMPT, PROMPT], "extra_key": ["tenant-a", "tenant-b"], "return_logprob": [False, False],
            "lora_path": [None, None], "sampling_params": {"max_new_tokens": 1}}
    generate(tiny, body)
    # each prompt went into its own namespace: a repeat in each finds its own copy, and "" is no namespace
    out = generate(tiny, {**body, "input_ids": [PROMPT + [1], PROMPT + [1]]})
    assert [o["meta_info"]["cached_tokens"] for o in out] == [8, 8]
    assert generate(tiny, {"input_ids": PROMPT + [1], "extra_key": "", "sampling_params": {"max_new_tokens": 1}}
                    )["meta_info"]["cached_tokens"] == 0


def test_abort_request_reaches_only_the_caller_s_own_requests(tiny_runner):
    settings = ServerSettings(model="tiny", api_key="user", admin_key="admin")
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=settings) as s:
        admin, user = {"Authorization": "Bearer admin"}, {"Authorization": "Bearer user"}
        e = s.engine
        e.stop()
        got: list[httpx.Response] = []
        try:
            t = threading.Thread(target=lambda: got.append(httpx.post(
                f"{s.url}/generate", headers=admin, timeout=60,
                json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 100}})))
            t.start()
            wait_until(lambda: s.host.inflight, what="the admin's request to reach the engine")
            rid = next(iter(s.host.inflight))
            e.step()
            for body in ({"abort_all": True}, {"rid": rid}, {"rid": rid.rsplit("-", 1)[0]}):
                assert httpx.post(f"{s.url}/abort_request", headers=user, json=body).json() == {"aborted": 0}
            assert s.host.inflight
            assert httpx.post(f"{s.url}/abort_request", headers=admin, json={"abort_all": True}).json() == \
                {"aborted": 1}
            e.step()
        finally:
            e.start()
        t.join(30)
        assert got[0].json()["meta_info"]["finish_reason"]["type"] == "abort"
        r = httpx.post(f"{s.url}/abort_request", headers=admin, json={"rid": "x", "bogus": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "bogus"


def test_a_request_drained_at_shutdown_ends_its_stream_with_sglang_s_error_event(tiny):
    e = tiny.engine
    e.stop()
    try:
        with httpx.stream("POST", f"{tiny.url}/generate", timeout=30,
                          json={"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 50}}) as r:
            wait_until(lambda: tiny.host.inflight, what="the request to reach the engine")
            tiny.host.abort(next(iter(tiny.host.inflight)), "shutdown")     # what a drain does to what is left
            e.step()
            lines = [ln for ln in r.iter_lines() if ln]
    finally:
        e.start()
    assert lines[-1] == "data: [DONE]"
    err = json.loads(lines[-2][6:])["error"]
    assert (err["code"], err["retryable"], err["type"]) == (503, True, "service_unavailable")


def samples_in_background(s, n: int) -> tuple[threading.Thread, list[httpx.Response], str]:
    """POST /generate for `n` samples of 50 tokens from a thread (its answer lands in the list); returns once
    the first sample is in the engine, with that sample's request id."""
    got: list[httpx.Response] = []
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 50, "n": n}}
    t = threading.Thread(target=lambda: got.append(httpx.post(f"{s.url}/generate", timeout=60, json=body)))
    t.start()
    wait_until(lambda: s.host.inflight, what="the first sample to reach the engine")
    return t, got, next(iter(s.host.inflight))


def test_aborting_a_response_ends_the_choices_it_has_not_submitted_yet(tiny_runner):
    """With one queue position a request (max_request_share=1) its four samples run one after another; an abort
    of the response id reached only the running one, and the next three then ran to the end."""
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny", max_request_share=1)) as s:
        e = s.engine
        e.stop()
        try:
            t, got, first = samples_in_background(s, 4)
            e.step()
            e.step()
            assert httpx.post(f"{s.url}/abort_request", json={"rid": first.rsplit("-", 1)[0]}).json() == \
                {"aborted": 4}
            e.step()
        finally:
            e.start()
        t.join(30)
        out = got[0].json()
        assert [o["meta_info"]["finish_reason"]["type"] for o in out] == ["abort"] * 4
        assert [o["meta_info"]["completion_tokens"] for o in out] == [2, 0, 0, 0]
        assert not s.host.inflight and not s.host.runs and s.host.reserved == 0
        e.check_invariants()


def test_an_abort_all_during_a_choice_s_submission_aborts_that_choice_too(tiny_runner):
    """abort_all counted the run's unsubmitted choices, then the requests in flight. A choice the run was
    submitting at that moment was in neither list, so it was never aborted and ran to max_new_tokens. Submitting
    a choice and cancelling the rest now exclude each other."""
    with serving(factory=tiny_factory(tiny_runner), initial_config={"model": "tiny", "pool_slots": 256},
                 settings=ServerSettings(model="tiny", max_request_share=1)) as s:
        e = s.engine
        e.stop()
        submitting, go = threading.Event(), threading.Event()
        real_submit = s.host.submit

        def slow_second_submit(engine, ids, params, key, caller, rid, *rest, **kw):
            if rid.endswith("-1"):
                submitting.set()
                assert go.wait(10)
            return real_submit(engine, ids, params, key, caller, rid, *rest, **kw)

        s.host.submit = slow_second_submit
        aborted: list[dict] = []
        try:
            t, got, first = samples_in_background(s, 2)
            assert httpx.post(f"{s.url}/abort_request", json={"rid": first}).json() == {"aborted": 1}
            assert submitting.wait(10), "the second sample was never submitted"
            a = threading.Thread(target=lambda: aborted.append(httpx.post(
                f"{s.url}/abort_request", timeout=30, json={"abort_all": True}).json()))
            a.start()
            a.join(0.5)       # the old code answered here, before the second sample reached the engine
            go.set()
            a.join(30)
        finally:
            go.set()
            e.start()
        t.join(30)
        assert aborted == [{"aborted": 1}]
        out = got[0].json()
        assert [o["meta_info"]["finish_reason"]["type"] for o in out] == ["abort", "abort"]
        assert [o["meta_info"]["completion_tokens"] for o in out] == [0, 0]
        wait_until(lambda: not s.host.inflight and not s.host.runs, what="everything to end")
        assert s.host.reserved == 0
        e.check_invariants()
