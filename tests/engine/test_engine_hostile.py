"""Issue 10, items 1-3, 6 and 9: inputs that passed validation and then stalled or leaked the engine.
Each test ends with no slot leaked and the engine still serving exact greedy output."""
from __future__ import annotations

import copy

import threading
import time

import pytest
import torch

from core.engine.engine import Engine
from core.engine.model.runner import ModelRunner
from core.engine.request import ABORTED, FINISHED
from core.engine.sampling import SamplingParams
from tests.engine_checks import still_serves
from tests.tiny_models import reference_greedy, tiny_pair

PROMPTS = [[7, 3, 9, 2, 11, 5], [8, 8, 1, 2], [4, 10, 12, 13, 14], [21, 22, 23], [30, 31, 32, 33, 34, 35]]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("llama")


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1e-9, "0.5", None, True])
def test_item1_non_finite_or_mistyped_temperature_is_refused(pair, temperature):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        e.submit([1, 2, 3], SamplingParams(temperature=temperature))
    still_serves(e, ref)


def test_item1_tiny_temperature_is_greedy_as_in_sglang(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    got = e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=6, temperature=1e-40))[0]
    assert got.error is None and got.token_ids == reference_greedy(ref, PROMPTS[0], 6)
    still_serves(e, ref)


def test_item1_a_request_the_model_poisons_fails_alone(pair):
    """A model fault confined to one request (NaN logits: its prompt holds a token whose embedding
    is NaN) fails that request only: the four innocent ones in the same batch finish exactly."""
    ref, runner = pair
    poisoned_ref, _ = tiny_pair("llama")
    poisoned = copy.deepcopy(poisoned_ref)
    with torch.no_grad():
        poisoned.model.embed_tokens.weight[99] = float("nan")
    poisoned_runner = ModelRunner.from_hf(poisoned, device="cpu")
    e = Engine(poisoned_runner, pool_slots=300)
    bad = e.submit([5, 99, 6], SamplingParams(max_new_tokens=4, temperature=0.8, seed=1))
    good = [e.submit(p, SamplingParams(max_new_tokens=5)) for p in PROMPTS[:4]]
    assert e.step()   # one batch holds all five
    while e.has_work():
        e.step()
    c = bad.result(0)
    assert c.finish_reason == "abort" and "non-finite" in c.error and e.requests.get(bad.rid).state == ABORTED
    for p, h in zip(PROMPTS, good):
        assert h.result(0).error is None and h.result(0).token_ids == reference_greedy(ref, p, 5)
    still_serves(e, poisoned_ref)


def test_a_poisoned_row_leaves_its_seeded_batch_mates_tokens_as_they_are_alone():
    """The batch's sampling fails at the poisoned row after the seeded rows before it drew from their
    generators; they are sampled again one by one from the states they had, so they draw the tokens they
    draw alone (they used to draw the next ones)."""
    poisoned_ref, _ = tiny_pair("llama")
    with torch.no_grad():
        poisoned_ref.model.embed_tokens.weight[99] = float("nan")
    runner = ModelRunner.from_hf(copy.deepcopy(poisoned_ref), device="cpu")
    seeded = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    alone = Engine(runner, pool_slots=300).generate([PROMPTS[0]], seeded)[0].token_ids
    e = Engine(runner, pool_slots=300)
    mate = e.submit(PROMPTS[0], seeded)
    bad = e.submit([5, 99, 6], SamplingParams(max_new_tokens=4, temperature=0.8, seed=1))
    while e.has_work():
        e.step()
    assert bad.result(0).finish_reason == "abort" and "non-finite" in bad.result(0).error
    assert mate.result(0).error is None and mate.result(0).token_ids == alone
    still_serves(e, poisoned_ref)


@pytest.mark.parametrize("priority", [None, "high", 1.5, True, 2 ** 70])
def test_item2_bad_priority_is_refused(pair, priority):
    ref, runner = pair
    e = Engine(runner, pool_slots=64, eviction_policy="priority")
    with pytest.raises(ValueError, match="priority must be an integer"):
        e.submit([1, 2, 3], SamplingParams(priority=priority))
    still_serves(e, ref)


def test_item2_priority_reaches_the_tree_and_the_priority_policy(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=64, eviction_policy="priority")
    e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=2, priority=7))
    e.generate([PROMPTS[1]], SamplingParams(max_new_tokens=2, priority=0))
    snap = e.snapshot().cache
    low = [n for n in snap.nodes[1:] if n.priority == 0]
    high = [n for n in snap.nodes[1:] if n.priority == 7]
    # each request's path (its prompt node and its output-token leaf) carries its priority
    assert [n.token_ids for n in high][0] == tuple(PROMPTS[0]) and [n.token_ids for n in low][0] == tuple(PROMPTS[1])
    assert len(low) == len(high) == 2
    # the low-priority path goes first although it is the most recently used
    assert set(snap.eviction_order[:2]) == {n.id for n in low}
    assert set(snap.eviction_order[2:]) == {n.id for n in high}
    still_serves(e, ref)


@pytest.mark.parametrize("extra_key", [["tenant"], {"a": 1}, 5, b"t"])
def test_item3_unhashable_or_non_string_extra_key_is_refused(pair, extra_key):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match="extra_key must be None or a string"):
        e.submit([1, 2, 3], extra_key=extra_key)
    assert e.step() is False
    still_serves(e, ref)


def test_an_extra_key_longer_than_1024_characters_is_refused(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match="extra_key is a name of at most 1,024 characters, got 1,025"):
        e.submit([1, 2, 3], extra_key="k" * 1025)
    assert e.step() is False
    h = e.submit([1, 2, 3], SamplingParams(max_new_tokens=1), extra_key="k" * 1024)
    while e.step():
        pass
    assert h.result(timeout=0).error is None and len(h.result(timeout=0).token_ids) == 1
    still_serves(e, ref)


def test_item3_extra_key_separates_namespaces(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    p = PROMPTS[0] * 3
    a = e.submit(p, SamplingParams(max_new_tokens=2), extra_key="alice")
    e.generate([], None)
    while e.has_work():
        e.step()
    b = e.submit(p, SamplingParams(max_new_tokens=2), extra_key="bob")
    c = e.submit(p, SamplingParams(max_new_tokens=2), extra_key="alice")
    while e.has_work():
        e.step()
    assert (a.result(0).cached_tokens, b.result(0).cached_tokens, c.result(0).cached_tokens) == (0, 0, len(p) - 1)
    assert a.result(0).token_ids == b.result(0).token_ids == c.result(0).token_ids
    still_serves(e, ref)


def test_item6_params_are_copied_and_frozen_at_submit(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=40)
    params = SamplingParams(max_new_tokens=4)
    h = e.submit(PROMPTS[0], params)
    params.max_new_tokens = 10_000          # would need far more than the 40-slot pool
    params.temperature = float("nan")
    params.stop = None
    req = e.requests.get(h.rid)
    assert req.params is not params and req.params.max_new_tokens == 4
    with pytest.raises(AttributeError, match="frozen"):
        req.params.max_new_tokens = 10_000
    while e.has_work():
        e.step()
    assert h.result(0).token_ids == reference_greedy(ref, PROMPTS[0], 4)
    with pytest.raises(ValueError, match="temperature"):   # what is validated now is what runs
        e.submit(PROMPTS[0], params)
    still_serves(e, ref)


@pytest.mark.parametrize("stop", [None, [""], [1], b"x", ("a",) * 65])
def test_bad_stop_is_refused(pair, stop):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match="stop must be"):
        e.submit([1, 2], SamplingParams(stop=stop))
    still_serves(e, ref)


def test_a_stop_string_over_256_characters_is_refused_and_one_of_256_runs(pair):
    """Each stop string is matched against the text's end at every token, so its length is capped."""
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match="at most 256 characters; one has 257: shorten it"):
        e.submit([1, 2], SamplingParams(stop=["ok", "x" * 257]))
    assert not e.requests.queued()
    got = e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4, stop=["x" * 256]))[0]
    assert got.error is None and got.token_ids == reference_greedy(ref, PROMPTS[0], 4)
    still_serves(e, ref)


def test_a_logit_bias_token_outside_the_vocabulary_is_refused_at_submit(pair):
    """As a prompt token outside the vocabulary is: a ValueError at submit, nothing queued (it used to be
    queued, prefilled, and then aborted when its first token was sampled)."""
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    vocab = runner.vocab_size
    with pytest.raises(ValueError, match=rf"logit_bias names token {vocab}, outside the vocabulary \(0..{vocab - 1}\)"):
        e.submit([1, 2], SamplingParams(logit_bias={3: 1.0, vocab: 1.0}))
    assert not e.requests.queued() and not e.has_work()
    got = e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4, logit_bias={vocab - 1: -100.0}))[0]
    assert got.error is None and len(got.token_ids) == 4
    still_serves(e, ref)


def test_aborting_a_queued_request_does_not_wait_for_the_running_step(pair, monkeypatch):
    """A request still in the inbox holds nothing, so abort ends it at once; it used to wait for the engine
    lock, which a step holds for its whole forward (here made to take 1.5 s)."""
    ref, runner = pair
    real = runner.forward
    in_forward = threading.Event()

    def slow_forward(*args, **kwargs):
        in_forward.set()
        time.sleep(1.5)
        return real(*args, **kwargs)
    monkeypatch.setattr(runner, "forward", slow_forward)
    e = Engine(runner, pool_slots=200).start()
    try:
        first = e.submit(PROMPTS[0], SamplingParams(max_new_tokens=1))
        assert in_forward.wait(30)
        queued = e.submit(PROMPTS[1], SamplingParams(max_new_tokens=4))
        started = time.perf_counter()
        assert e.abort(queued.rid)
        waited = time.perf_counter() - started
        c = queued.result(0)
        assert waited < 0.5 and c.finish_reason == "abort" and c.token_ids == []
        assert first.result(60).token_ids == reference_greedy(ref, PROMPTS[0], 1)
        assert e.metrics.requests_aborted == 1 and not e.abort(queued.rid)
    finally:
        e.stop()
        monkeypatch.setattr(runner, "forward", real)
    still_serves(e, ref)


def _raise_once(obj, name: str, monkeypatch) -> None:
    """obj.name raises KeyboardInterrupt (Ctrl-C) on its next call, then is itself again."""
    real = getattr(obj, name)

    def interrupted(*args, **kwargs):
        monkeypatch.setattr(obj, name, real)
        raise KeyboardInterrupt
    monkeypatch.setattr(obj, name, interrupted)


def test_ctrl_c_during_a_steps_forward_loses_no_slot(pair, monkeypatch):
    """The CLI steps on its main thread, so Ctrl-C lands inside a step: the step's fresh slots (held by
    its work items only) go back, its requests end as aborted, and the interrupt still propagates."""
    ref, runner = pair
    e = Engine(runner, pool_slots=200, max_prefill_tokens=4)
    h = e.submit(list(range(20, 40)), SamplingParams(max_new_tokens=4))
    assert e.step()                                   # a first chunk of 4 cached, the rest to come
    _raise_once(runner, "forward", monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        e.step()
    c = h.result(0)
    assert c.finish_reason == "abort" and c.error.startswith("KeyboardInterrupt")
    still_serves(e, ref)


def test_ctrl_c_between_the_forward_and_the_token_leaves_no_request_stuck(pair, monkeypatch):
    """Interrupted after its chunk was committed but before its token: the request used to stay running
    with nothing left to compute and no token, forever. Now it ends as aborted, its slots given back."""
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    h = e.submit(PROMPTS[1], SamplingParams(max_new_tokens=4))
    _raise_once(e, "_sample", monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        e.step()
    assert not e.has_work()
    c = h.result(0)
    assert c.finish_reason == "abort" and c.token_ids == []
    still_serves(e, ref)


@pytest.mark.parametrize("field, value, message", [
    ("seed", 2 ** 63, "seed must be None or a 64-bit integer"), ("seed", 1.5, "seed must be None or a 64-bit"),
    ("top_k", 2.0, "top_k must be an integer"), ("top_p", float("nan"), r"top_p must be in \(0, 1\]"),
    ("ignore_eos", "yes", "ignore_eos must be True or False"), ("max_new_tokens", 3.0, "max_new_tokens must be"),
    ("top_p", 10 ** 400, r"top_p must be in \(0, 1\]"), ("frequency_penalty", -10 ** 400, "frequency_penalty must be"),
    ("repetition_penalty", 1e-300, r"repetition_penalty must be in \[0.01, 2\]"),
])
def test_every_field_is_type_checked(pair, field, value, message):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match=message):
        e.submit([1, 2], SamplingParams(**{field: value}))
    still_serves(e, ref)


def test_item9_generate_is_all_or_nothing(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        e.generate([PROMPTS[0], PROMPTS[1], [999]], SamplingParams(max_new_tokens=3))
    assert not e.has_work() and all(r.state == ABORTED for r in e.requests.listing()[0])
    still_serves(e, ref)


def test_item9_generate_timeout_cancels(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=400).start()
    try:
        with pytest.raises(TimeoutError):
            e.generate([PROMPTS[0], PROMPTS[1]], SamplingParams(max_new_tokens=300, ignore_eos=True), timeout=0.01)
        # nothing is left running without a handle: each request was aborted, or had already finished when
        # the caller's thread got to abort it (the engine's loop can make 300 tiny-model tokens before then)
        states = [(r.rid, r.state, r.finish_reason) for r in e.requests.listing()[0]]
        assert states and all(st == ABORTED or (st == FINISHED and why == "length") for _, st, why in states), states
    finally:
        e.stop()
    still_serves(e.start(), ref)


def test_item9_generate_timeout_without_a_loop(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=400)
    with pytest.raises(TimeoutError):
        e.generate([PROMPTS[2]], SamplingParams(max_new_tokens=300), timeout=0.0)
    still_serves(e, ref)


def test_item9_short_stop_then_start_never_runs_two_loops(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=400).start()
    h = e.submit(PROMPTS[0], SamplingParams(max_new_tokens=60))
    e.stop(timeout=0)        # shorter than any step
    e.start()
    loops = [t for t in threading.enumerate() if t.name == e.loop.thread_name]
    assert len(loops) == 1
    assert h.result(timeout=120).token_ids == reference_greedy(ref, PROMPTS[0], 60)
    e.stop()
    assert not [t for t in threading.enumerate() if t.name == e.loop.thread_name]
    still_serves(e, ref)


@pytest.mark.parametrize("prompt, message", [
    (b"hello", "not bytes"), (bytearray(b"\x01\x02"), "not bytes"), ({"role": "user"}, "a prompt is a string"),
    ([1, 2.0], "a prompt is a string"), ([True, 1], "a prompt is a string"), (42, "a prompt is a string"),
    (None, "a prompt is a string"),
])
def test_item9_bytes_and_odd_prompts_are_refused(pair, prompt, message):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match=message):
        e.submit(prompt)
    still_serves(e, ref)


@pytest.mark.parametrize("kwargs, message", [
    (dict(pool_slots=True), "pool_slots must be an integer"), (dict(pool_slots=64.0), "pool_slots must be an integer"),
    (dict(max_running_requests=2.5), "max_running_requests must be an integer"),
    (dict(max_prefill_tokens=0), "max_prefill_tokens must be an integer"),
    (dict(page_size="2"), "page_size must be an integer"),
    (dict(disable_radix_cache="no"), "disable_radix_cache must be True or False"),
    (dict(pool_slots=10 ** 12), "lower pool_slots"),
    (dict(pool_slots=100, page_size=16), "pool_slots=100 is not a multiple of page_size=16; use pool_slots=96 or 112"),
])
def test_item9_bad_engine_settings(pair, kwargs, message):
    _, runner = pair
    with pytest.raises(ValueError, match=message):
        Engine(runner, **kwargs)


@pytest.mark.parametrize("model, message", [
    (None, "model must be 'default', a local model path or a ModelRunner"),
    (3, "model must be 'default'"),
])
def test_item9_bad_model_argument(model, message):
    with pytest.raises(ValueError, match=message):
        Engine(model)


def test_item9_cuda_on_a_cpu_box_is_one_value_error():
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="unknown device"):
            Engine("default", device="tpu9")
    else:
        with pytest.raises(ValueError, match="CUDA is not available on this machine; pass --device cpu"):
            Engine("default", device="cuda")


def test_bad_rid_and_params_type(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=200)
    with pytest.raises(ValueError, match="rid must be None or a non-empty string"):
        e.submit([1], rid=["x"])
    with pytest.raises(ValueError, match="params must be SamplingParams"):
        e.submit([1], params={"max_new_tokens": 2})
    e.submit([1], SamplingParams(max_new_tokens=1), rid="same")
    with pytest.raises(ValueError, match="belongs to a request still running"):
        e.submit([2], rid="same")
    e.generate([[9]], SamplingParams(max_new_tokens=1))                    # one batch with "same": both done
    again = e.submit([2, 3], SamplingParams(max_new_tokens=2), rid="same")   # done: the rid is free again
    while e.step():
        pass
    assert again.result(0).token_ids == reference_greedy(ref, [2, 3], 2)
    still_serves(e, ref)
