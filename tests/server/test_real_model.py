"""The official openai client against a live server on the real default model (SmolLM2-135M)."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from core.engine.engine import Engine
from core.server.app import ServerSettings
from tests.server.conftest import serving, wait_until

SYSTEM = "You are a concise assistant. Answer in one short sentence."
QUESTIONS = ["What is the capital of France?", "Why is the sky blue?", "What is 2 + 2?", "Name a primary colour.",
             "What do bees make?", "Who wrote Hamlet?", "What is water made of?", "How many legs has a spider?"]


@pytest.fixture(scope="module")
def real(smollm2_runner):
    with serving(Engine(smollm2_runner, pool_slots=4096, max_running_requests=16),
                 settings=ServerSettings(model="default")) as s:
        yield s


def _chat(client, q: str, **kw) -> str:
    r = client.chat.completions.create(model="default", temperature=0, max_tokens=8,
                                       messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                       **kw)
    return r.choices[0].message.content


def test_chat_stream_and_repeat_hits_the_cache(real):
    c = real.client()
    r = c.chat.completions.create(model="default", temperature=0, max_tokens=12,
                                  messages=[{"role": "user", "content": QUESTIONS[0]}])
    assert "Paris" in r.choices[0].message.content and r.choices[0].message.role == "assistant"
    chunks = list(c.chat.completions.create(model="default", temperature=0, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": QUESTIONS[0]}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    usage = chunks[-1].usage
    assert usage.prompt_tokens == r.usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens > 0
    done = c.completions.create(model="default", prompt="The capital of France is", max_tokens=3, temperature=0)
    assert done.choices[0].text.strip().startswith("Paris")
    stopped = c.completions.create(model="default", prompt="The capital of France is", max_tokens=12, temperature=0,
                                   stop=["."])
    assert stopped.choices[0].finish_reason == "stop" and "." not in stopped.choices[0].text


def test_16_concurrent_clients_times_4_requests_equal_each_alone(real):
    assert httpx.post(f"{real.url}/flush_cache").status_code == 200
    c = real.client()
    alone = {q: _chat(c, q) for q in QUESTIONS}    # one at a time, the cache empty at the start
    assert len(set(alone.values())) > 4

    def client_run(j: int) -> list[tuple[str, str]]:
        mine = real.client()
        return [(q, _chat(mine, q)) for q in (QUESTIONS[(j + i) % len(QUESTIONS)] for i in range(4))]

    with ThreadPoolExecutor(16) as pool:
        results = [pair for got in pool.map(client_run, range(16)) for pair in got]
    assert len(results) == 64
    diffs = [(q, out, alone[q]) for q, out in results if out != alone[q]]
    assert not diffs, diffs[:3]
    wait_until(lambda: not real.host.inflight, what="the watchers to finish")
    snap = real.engine.snapshot()
    assert snap.metrics["running"] == 0 and snap.metrics["in_use_slots"] == 0
    real.engine.check_invariants()


def test_mid_stream_disconnect_on_the_real_model_frees_its_slots(real):
    e = real.engine
    with httpx.stream("POST", f"{real.url}/v1/completions", timeout=30,
                      json={"model": "default", "prompt": "Count from one to one hundred:", "max_tokens": 300,
                            "temperature": 0, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        assert sum(1 for _, ln in zip(range(8), lines) if ln.startswith("data: ")) >= 3
    wait_until(lambda: not real.host.inflight, what="the abort")
    snap = e.snapshot()
    assert snap.requests[-1].state == "aborted" and snap.requests[-1].output_tokens < 300
    assert snap.metrics["in_use_slots"] == 0 and snap.metrics["locked_slots"] == 0
    e.check_invariants()


def test_state_snapshot_polled_every_quarter_second_shows_a_40_token_request_running_with_tokens_rising(real):
    """Issue 28's check: the published snapshot is never stale, so every poll after the request's first step
    shows it running and its output count rises from poll to poll until it finishes."""
    import threading
    import time

    from core.observe import wire
    c = real.client()
    prompt = "Poll me: once upon a time, in a land far away,"
    done = threading.Event()

    def run() -> None:
        try:
            c.completions.create(model="default", prompt=prompt, max_tokens=40, temperature=0,
                                 extra_body={"ignore_eos": True})
        finally:
            done.set()
    threading.Thread(target=run, daemon=True).start()
    polls = []
    while not done.is_set():
        r = httpx.get(real.url + "/state/snapshot", timeout=10)
        assert r.status_code == 200
        view = next((q for q in wire.snapshot_from_json(r.content).requests if q.prompt_text == prompt), None)
        if view is not None:
            polls.append((view.state, view.output_tokens))
        time.sleep(0.25)
    first = next(i for i, (_, n) in enumerate(polls) if n >= 1)
    during = [p for p in polls[first:] if p[1] < 40]
    assert len(during) >= 2, polls
    assert all(state == "running" for state, _ in during), polls
    counts = [n for _, n in during]
    assert counts == sorted(counts), polls
    # rising from poll to poll (a step of this model takes well under the 0.25 s between polls; on a box so
    # loaded that a step takes longer, two polls may see one step, but never most of them)
    assert len(set(counts)) >= max(2, (len(counts) + 1) // 2), polls


def test_a_chat_without_max_tokens_runs_to_the_end_of_the_room_and_null_content_is_refused(smollm2_runner):
    """A chat with neither max_tokens nor max_completion_tokens stopped at 128 tokens (and near the context end
    failed naming a max_tokens the client never sent); SGLang's chat clamps an unset limit to the context, and
    OpenAI's has none. Here the room is the pool's: 160 slots hold the prompt and 161 - prompt new tokens."""
    with serving(Engine(smollm2_runner, pool_slots=160), settings=ServerSettings(model="default")) as s:
        c = s.client()
        r = c.chat.completions.create(model="default", temperature=0, messages=[{"role": "user", "content": "Hi"}],
                                      extra_body={"ignore_eos": True})
        n = r.usage.prompt_tokens
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 160 - n + 1 > 128
        with pytest.raises(openai.BadRequestError, match="a user message needs its content"):
            c.chat.completions.create(model="default", messages=[{"role": "user", "content": None}])
        chunks = list(c.chat.completions.create(model="default", temperature=0, max_tokens=3, stream=True,
                                                stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": "Hi"}]))
        raw = [ch.to_dict() for ch in chunks]
        assert all("usage" in d for d in raw) and [d["usage"] is None for d in raw][:-1] == [True] * (len(raw) - 1)


def test_sglang_s_generate_answers_the_completion_s_text_and_names_what_stopped_it(real):
    """/generate (SGLang's native API) on the real model: the same greedy text as /v1/completions, a stream whose
    cumulative text and ids grow to the same answer, and finish reasons as SGLang writes them."""
    prompt = "The capital of France is"
    want = real.client().completions.create(model="default", prompt=prompt, max_tokens=8, temperature=0)
    out = httpx.post(f"{real.url}/generate", timeout=60, json={"text": prompt, "sampling_params": {
        "max_new_tokens": 8, "temperature": 0}}).json()
    assert out["text"] == want.choices[0].text and real.engine.tokenizer.decode(out["output_ids"]) == out["text"]
    assert out["meta_info"]["prompt_tokens"] == want.usage.prompt_tokens
    with httpx.stream("POST", f"{real.url}/generate", timeout=60, json={"text": prompt, "stream": True,
                                                                       "sampling_params": {"max_new_tokens": 8,
                                                                                           "temperature": 0}}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln and ln != "data: [DONE]"]
    assert len(chunks) >= 4 and chunks[-1]["text"] == out["text"] and chunks[-1]["output_ids"] == out["output_ids"]
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"]) and b["output_ids"][:len(a["output_ids"])] == a["output_ids"]
    assert all(c["meta_info"]["completion_tokens"] == len(c["output_ids"]) for c in chunks)
    assert [c["meta_info"]["finish_reason"] is None for c in chunks] == [True] * (len(chunks) - 1) + [False]
    stopped = httpx.post(f"{real.url}/generate", timeout=60, json={"text": prompt, "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "stop": ["."]}}).json()
    assert stopped["text"] == " Paris" and stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": "."}
    tok = real.engine.tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": QUESTIONS[2]}], tokenize=False,
                                   add_generation_prompt=True)
    eos = httpx.post(f"{real.url}/generate", timeout=60, json={"text": chat, "sampling_params": {
        "max_new_tokens": 64, "temperature": 0}}).json()
    assert eos["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos["output_ids"][-1]}
    assert eos["output_ids"][-1] in real.engine.runner.eos_token_ids and "4" in eos["text"]


def test_a_generate_stream_sends_the_finishing_token_once_however_late_the_request_is_marked_done(real, monkeypatch):
    """The finishing token's text was queued, then the request was released into the tree and marked done; a
    watcher that read the piece in between sent it as an event, then the completion again as the last one. With
    the release slowed, every event still adds text, and the finishing token rides on the last event alone."""
    real_finish = real.engine.scheduler.finish

    def slow_finish(req):
        time.sleep(0.2)
        return real_finish(req)

    monkeypatch.setattr(real.engine.scheduler, "finish", slow_finish)
    with httpx.stream("POST", f"{real.url}/generate", timeout=60, json={
            "text": "The capital of France is", "stream": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0}}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln and ln != "data: [DONE]"]
    texts = [c["text"] for c in chunks]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5, 6], texts
    assert all(len(a) < len(b) for a, b in zip(texts, texts[1:])), texts
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


def test_a_generate_stream_pairs_each_text_with_its_own_ids_however_far_the_watcher_lags(real, monkeypatch):
    """A chunk's output_ids were read when the watcher delivered its text, so a watcher behind the engine sent
    ids a token or more ahead of the text. With every delivery slowed to more than a decode step, each chunk's
    ids still decode to exactly its text."""
    real_submit = real.host.submit

    def lagging_submit(engine, ids, params, key, caller, rid, on_piece=None, *rest, **kw):
        def late(piece, handle):
            time.sleep(0.25)
            on_piece(piece, handle)
        return real_submit(engine, ids, params, key, caller, rid, late if on_piece else None, *rest, **kw)

    monkeypatch.setattr(real.host, "submit", lagging_submit)
    with httpx.stream("POST", f"{real.url}/generate", timeout=60, json={
            "text": "The capital of France is", "stream": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0}}) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln and ln != "data: [DONE]"]
    tok = real.engine.tokenizer
    assert [tok.decode(c["output_ids"]) for c in chunks] == [c["text"] for c in chunks]
    assert len(chunks[-1]["output_ids"]) == 6
