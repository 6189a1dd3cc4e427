"""Issue 10, items 4 and 5 and the property test: many threads against one engine, and streams
that never lose text."""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from core.engine.engine import Engine
from core.engine.model.loader import resolve_model
from core.engine.model.runner import ModelRunner
from core.engine.request import stream_safe_len
from core.engine.sampling import SamplingParams
from tests.engine_checks import no_leak, still_serves
from tests.tiny_models import TINY, reference_greedy, tiny_pair


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("llama")


def test_item4_submit_flood_from_12_threads_while_snapshots_run(pair):
    ref, runner = pair
    e = Engine(runner, pool_slots=3000, max_running_requests=64).start()
    errors: list[BaseException] = []
    handles: list = []
    stop = threading.Event()

    def submitter(k: int) -> None:
        try:
            rng = random.Random(k)
            for _ in range(25):
                handles.append(e.submit([rng.randrange(1, 128) for _ in range(rng.randrange(2, 8))],
                                        SamplingParams(max_new_tokens=1)))
        except BaseException as exc:
            errors.append(exc)

    def viewer() -> None:
        try:
            while not stop.is_set():
                s = e.snapshot(wait=False)
                assert all(r.rid for r in s.requests)
        except BaseException as exc:
            errors.append(exc)

    viewers = [threading.Thread(target=viewer) for _ in range(2)]
    subs = [threading.Thread(target=submitter, args=(k,)) for k in range(12)]
    for t in viewers + subs:
        t.start()
    for t in subs:
        t.join(60)
    done = [h.result(timeout=120) for h in handles]
    stop.set()
    for t in viewers:
        t.join(10)
    assert not errors, errors[:3]
    assert len(done) == 300 and all(c.finish_reason == "length" and len(c.token_ids) == 1 for c in done)
    assert e.last_error is None
    e.stop()
    still_serves(e, ref)


# ----- streaming ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model("default"))


def test_item5_emoji_stream_holds_back_only_the_incomplete_tail(tokenizer):
    """Decode "Emoji 😀 then text" token by token as the engine does: the stream never shows
    U+FFFD, never stops, and ends equal to the final text."""
    text = "Emoji 😀 then text"
    ids = tokenizer.encode(text, add_special_tokens=False)
    partial = [tokenizer.decode(ids[:i + 1]) for i in range(len(ids))]
    assert any(p.endswith("\ufffd") for p in partial)     # the emoji really spans tokens
    streamed = ""
    for i, p in enumerate(partial):
        safe = p[:stream_safe_len(p, (), i == len(ids) - 1)]
        assert safe.startswith(streamed) and "\ufffd" not in safe
        streamed = safe
    assert streamed == text


@pytest.mark.parametrize("text, stop, expect", [
    ("abc</s", ("</stop>",), 3),     # "</s" may grow into the stop string: held
    ("abc<", ("</stop>",), 3),
    ("abc", ("</stop>",), 3),        # nothing that could start it: all sent
    ("a\ufffd", (), 1), ("a\ufffd\ufffd", ("x",), 1),
    ("ab", ("bc", "b"), 1), ("ab", ("zz",), 2),
])
def test_stream_safe_len_holds_back_only_a_possible_stop_prefix(text, stop, expect):
    assert stream_safe_len(text, stop, finished=False) == expect
    assert stream_safe_len(text, stop, finished=True) == len(text)


def _held_by_every_k(text: str, stop: tuple) -> int:
    """The rule by its definition: the longest k < len(s) for which the text ends with s[:k]."""
    end = len(text)
    while end and text[end - 1] == "\ufffd" and len(text) - end < 4:
        end -= 1
    return end - max([k for s in stop for k in range(1, min(len(s) - 1, end) + 1) if text[:end].endswith(s[:k])],
                     default=0)


def test_stream_safe_len_matches_its_definition_on_random_texts():
    """Only the places where a stop string's first character sits (and whose end matches) are compared
    now, where every k was, a slice each (quadratic in the stop string's length at every token): the same
    answer everywhere."""
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice("ab\ufffd") for _ in range(rng.randrange(0, 12)))
        stop = tuple("".join(rng.choice("ab") for _ in range(rng.randrange(1, 9))) for _ in range(rng.randrange(1, 4)))
        assert stream_safe_len(text, stop, finished=False) == _held_by_every_k(text, stop), (text, stop)


def test_item5_engine_stream_survives_a_character_split_across_tokens(tokenizer):
    """The engine's own detokenizer fed the tokens of "Emoji 😀 then text" (as a model would emit
    them, one per step): the stream goes on past the emoji and ends equal to the final text."""
    torch.manual_seed(0)
    cfg = LlamaConfig(**{**TINY, "vocab_size": len(tokenizer)})
    runner = ModelRunner.from_hf(AutoModelForCausalLM.from_config(cfg), tokenizer=tokenizer, device="cpu")
    e = Engine(runner, pool_slots=200)
    text = "Emoji 😀 then text"
    ids = tokenizer.encode(text, add_special_tokens=False)
    h = e.submit("Say it:", SamplingParams(max_new_tokens=len(ids) + 1))
    req = e.requests.get(h.rid)
    seen = []
    for tok in ids:
        e._append_token(req, tok)
        seen.append(h.stream_available())
    assert req.output_text == text
    assert "".join(seen) == text                 # nothing held back but what must be, nothing lost
    assert all("\ufffd" not in piece for piece in seen)
    e.abort(h.rid)
    no_leak(e)


# ----- property test -----------------------------------------------------------------------------------
BAD = [dict(temperature=float("nan")), dict(priority=None), dict(max_new_tokens=-1), dict(top_p=2.0),
       dict(stop=[""]), dict(seed="x"), dict(max_new_tokens=10_000)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_interleavings_from_several_threads(pair, seed):
    """Submitters (good and bad params, mutating params after submit), aborters, viewers and one
    thread that stops and starts the loop, all at once. Invariants hold at the end, every bad
    submit raised ValueError and queued nothing, and every good request that was not aborted
    finished with the stock model's greedy tokens."""
    ref, runner = pair
    rng0 = random.Random(seed)
    system = [rng0.randrange(1, 128) for _ in range(36)]
    prompts = [system[:rng0.choice([0, 36])] + [rng0.randrange(1, 128) for _ in range(rng0.randrange(2, 6))]
               for _ in range(10)]
    expected = {i: reference_greedy(ref, p, 4) for i, p in enumerate(prompts)}
    e = Engine(runner, pool_slots=240, max_running_requests=6, max_prefill_tokens=48).start()
    good: list = []          # (prompt index, handle)
    aborted: set = set()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def submitter(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        try:
            for _ in range(12):
                if rng.random() < 0.3:
                    with pytest.raises(ValueError):
                        e.submit(prompts[0], SamplingParams(**rng.choice(BAD)))
                    continue
                i = rng.randrange(len(prompts))
                params = SamplingParams(max_new_tokens=4)
                h = e.submit(prompts[i], params)
                params.max_new_tokens, params.temperature = 10_000, float("nan")   # after submit: no effect
                with lock:
                    good.append((i, h))
                time.sleep(rng.random() * 0.01)
        except BaseException as exc:
            errors.append(exc)

    def aborter() -> None:
        rng = random.Random(seed + 7)
        try:
            for _ in range(10):
                time.sleep(rng.random() * 0.02)
                with lock:
                    pick = rng.choice(good)[1] if good else None
                if pick is not None and e.abort(pick.rid):
                    aborted.add(pick.rid)
        except BaseException as exc:
            errors.append(exc)

    def viewer() -> None:
        try:
            for _ in range(30):
                e.snapshot(wait=False)
                e.events_since(max(0, e.cache.events.last_seq - 50))
        except BaseException as exc:
            errors.append(exc)

    def restarter() -> None:
        rng = random.Random(seed + 9)
        try:
            for _ in range(4):
                time.sleep(rng.random() * 0.03)
                e.stop(timeout=rng.choice([0, 0.001, 5]))
                e.start()
        except BaseException as exc:
            errors.append(exc)

    threads = ([threading.Thread(target=submitter, args=(k,)) for k in range(3)]
               + [threading.Thread(target=f) for f in (aborter, viewer, restarter)])
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    e.start()
    results = [(i, h.result(timeout=120)) for i, h in good]
    e.stop()
    assert not errors, errors[:3]
    assert len([t for t in threading.enumerate() if t.name == e.loop.thread_name]) == 0
    for i, c in results:
        if c.rid in aborted:
            assert c.finish_reason in ("abort", "length")
        else:
            assert c.error is None and c.finish_reason == "length" and c.token_ids == expected[i]
    assert len(results) > len(aborted)
    still_serves(e, ref)
