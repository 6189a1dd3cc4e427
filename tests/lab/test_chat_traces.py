"""Chat traces: OpenAI request logs and Batch lines, ShareGPT and LMSYS conversations, JSON array files."""
from __future__ import annotations

import gzip
import json

import pytest

from core.engine.engine import Engine
from core.engine.inputs import tokenize
from core.engine.sampling import SamplingParams
from core.lab.chat_traces import ChatTokenizer, hf_chat, interleave
from core.lab.replay import replay
from core.lab.traces import load_trace
from core.lab.workloads import TraceRequest, Workload


@pytest.fixture(scope="module")
def tok(smollm2_runner):
    return smollm2_runner.tokenizer


@pytest.fixture(scope="module")
def chat(tok):
    return hf_chat(tok)


def write(tmp_path, records, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return p


def engine_ids(tok, messages):
    """The prompt ids the engine gives these chat messages (the server's chat route reads them so)."""
    return tokenize(tok, len(tok), messages)[0]


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


SHAREGPT = {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "Hello there"},
                                         {"from": "human", "value": "how are you?"}, {"from": "gpt", "value": "Fine."}]}


def test_a_sharegpt_conversation_is_one_request_per_answer_each_prompt_as_the_engine_reads_it(tmp_path, tok, chat):
    wl = load_trace(write(tmp_path, [SHAREGPT]), chat=chat)
    first, second = wl.requests
    assert first.prompt_ids().tolist() == engine_ids(tok, [U("hi")])
    assert second.prompt_ids().tolist() == engine_ids(tok, [U("hi"), A("Hello there"), U("how are you?")])
    # the output is what a model answering so generates: the answer and its end-of-turn token (EOS), not
    # the template's newline after it
    assert tok.decode(first.output_ids()) == "Hello there<|im_end|>" and first.output_ids()[-1] == tok.eos_token_id
    assert tok.decode(second.output_ids()) == "Fine.<|im_end|>"
    assert wl.params == {"format": "jsonl", "conversations": 1, "sessions": 16} and not wl.has_timestamps


def test_the_next_turn_finds_the_answer_cached_as_the_engine_does_after_generating_it(tmp_path, tok, chat,
                                                                                     smollm2_runner):
    """The model's own greedy answer, fed back as the conversation's answer: the lab's second turn hits the same
    tokens the engine's cache gives the second turn after the engine generated that answer."""
    question = [U("What is the capital of France? Answer in one word.")]
    e = Engine(smollm2_runner, pool_slots=600)
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    answer = e.generate([question], greedy)[0]
    assert answer.finish_reason in ("stop", "eos") and answer.token_ids[-1] == tok.eos_token_id, answer
    follow = question + [A(answer.text), U("And of Spain?")]
    on_engine = e.generate([follow], SamplingParams(max_new_tokens=1))[0].cached_tokens

    wl = load_trace(write(tmp_path, [{"messages": follow + [A("Madrid.")]}]), chat=chat)
    assert wl.requests[0].output_ids().tolist() == answer.token_ids   # the template writes the model's tokens
    res = replay(wl, capacity_tokens=10_000)
    assert res.hit_tokens == on_engine == wl.requests[0].cached_len > 0


def test_conversations_replay_sessions_at_a_time_and_a_new_one_takes_an_ended_ones_place():
    def convo(tag, n):
        return [TraceRequest([tag, k]) for k in range(n)]

    def order(sessions):
        convos = [convo(1, 3), convo(2, 1), convo(3, 2)]
        return [tuple(r.prompt_ids().tolist()) for r in interleave(convos, sessions)]

    assert order(1) == [(1, 0), (1, 1), (1, 2), (2, 0), (3, 0), (3, 1)]
    assert order(2) == [(1, 0), (2, 0), (1, 1), (3, 0), (1, 2), (3, 1)]
    assert order(3) == order(99) == [(1, 0), (2, 0), (3, 0), (1, 1), (3, 1), (1, 2)]
    singles = [convo(t, 1) for t in range(5)]       # a log of single requests keeps its order at any sessions
    assert [r.prompt_ids()[0] for r in interleave(singles, 2)] == [0, 1, 2, 3, 4]


def test_how_many_sessions_decides_whether_the_answers_are_still_cached(tmp_path, chat):
    """Ten two-turn conversations through a pool that holds the shared opening and three first turns. One at a
    time, every second turn finds its whole first turn; ten at once, the first turns of the others evicted it,
    and every turn finds only the opening all prompts share (LRU keeps it: every request uses it)."""
    convos = [{"conversations": [{"from": "human", "value": f"Tell me about topic {k} " * 8},
                                 {"from": "gpt", "value": f"Topic {k} is long " * 8},
                                 {"from": "human", "value": "More?"}, {"from": "gpt", "value": "No."}]}
              for k in range(10)]
    path = write(tmp_path, convos)
    hits = {}
    for sessions in (1, 10):
        wl = load_trace(path, chat=chat, sessions=sessions)
        assert len(wl) == 20 and wl.params["sessions"] == sessions
        biggest = max(r.cached_len for r in wl.requests)
        hits[sessions] = replay(wl, capacity_tokens=2 * biggest + 40).hit_tokens
    first_turn = wl.requests[0]          # all first turns have the same length
    a, b = (r.prompt_ids() for r in wl.requests[:2])
    shared = int((a[:len(b)] == b[:len(a)]).argmin())        # the system prompt and "...Tell me about topic "
    assert shared > 20 and 3 * (first_turn.cached_len - shared) + shared <= 2 * biggest + 40 < 4 * first_turn.cached_len
    assert hits[1] == 10 * first_turn.cached_len + 9 * shared
    assert hits[10] == 19 * shared


def test_openai_request_lines_and_batch_lines_take_their_max_tokens_as_the_output_length(tmp_path, tok, chat):
    lines = [{"messages": [U("Say hi")], "max_tokens": 8, "timestamp": 20},
             {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "messages": [U("Say bye")], "max_completion_tokens": 4}, "timestamp": 10},
             {"messages": [U("Say why")], "output_len": 3, "max_tokens": 100, "timestamp": 30}]
    wl = load_trace(write(tmp_path, lines), chat=chat)
    assert [r.prompt_ids().tolist() for r in wl.requests] == [engine_ids(tok, [U(t)]) for t in
                                                             ("Say bye", "Say hi", "Say why")]
    assert [r.output_len for r in wl.requests] == [4, 8, 3]                 # output_len is the real length: it wins
    assert [r.timestamp for r in wl.requests] == [10, 20, 30] and wl.params == {"format": "jsonl", "reordered": 2}
    assert not any(r.has_output_ids for r in wl.requests)


def test_a_chat_line_with_its_output_text_gets_the_template_s_tokens_for_that_answer(tmp_path, tok, chat):
    wl = load_trace(write(tmp_path, [{"messages": [U("Capital of France?")], "output": "Paris."},
                                     [U("Capital of Italy?")]]), chat=chat)
    with_answer, bare = wl.requests
    assert tok.decode(with_answer.output_ids()) == "Paris.<|im_end|>" and with_answer.output_len == 3
    assert bare.prompt_ids().tolist() == engine_ids(tok, [U("Capital of Italy?")]) and bare.output_len == 1


def test_lmsys_conversations_and_openai_text_parts_read_as_their_text(tmp_path, tok, chat):
    lines = [{"conversation_id": "x", "conversation": [U("Hi"), A("Hello!")]},
             {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 2}]
    wl = load_trace(write(tmp_path, lines), chat=chat)
    assert wl.requests[0].prompt_ids().tolist() == wl.requests[1].prompt_ids().tolist() == engine_ids(tok, [U("Hi")])


def test_a_json_array_written_over_many_lines_reads_element_by_element_plain_or_gzipped(tmp_path, tok, chat):
    text = json.dumps([SHAREGPT, {"input_ids": [5, 6, 7], "output_len": 2}], indent=2)
    plain = tmp_path / "sharegpt.json"
    plain.write_text(text)
    packed = tmp_path / "sharegpt.json.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        wl = load_trace(path, chat=chat)
        assert [r.prompt_len for r in wl.requests] == [len(engine_ids(tok, [U("hi")])), 3,
                                                       len(engine_ids(tok, [U("hi"), A("Hello there"),
                                                                            U("how are you?")]))]
    one_line = write(tmp_path, [[{"input_ids": [1, 2]}, {"input_ids": [3]}]], name="one.json")
    assert [r.prompt_ids().tolist() for r in load_trace(one_line).requests] == [[1, 2], [3]]


def test_a_broken_json_array_names_the_element_and_says_it_cannot_be_skipped(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"input_ids": [1, 2]},\n  {"input_ids": [3,, 4]},\n  {"input_ids": [5]}\n]\n')
    with pytest.raises(ValueError, match=r"broken.json, element 2: not valid JSON .*cannot be read past it"):
        load_trace(path, on_error="skip")
    path.write_text('[\n  {"input_ids": [1, 2]},\n  {"input_ids": []},\n  {"input_ids": [5]}\n]\n')
    with pytest.raises(ValueError, match=r"broken.json, element 2: malformed JSONL record: input_ids must be"):
        load_trace(path)
    assert [r.prompt_ids().tolist() for r in load_trace(path, on_error="skip").requests] == [[1, 2], [5]]
    path.write_text('[\n  {"input_ids": [1, 2]}\n]\n{"input_ids": [3]}\n')
    with pytest.raises(ValueError, match="text after the JSON array's closing"):
        load_trace(path)
    path.write_bytes(b'[\n  {"text": "caf\xe9"}\n]\n')      # Latin-1, not UTF-8
    with pytest.raises(ValueError, match=r"broken.json: not UTF-8 text \(byte 0xe9 at offset 17\)"):
        load_trace(path)
    path.write_text('[\n  {"input_ids": [1, 2]},\n  {"input_ids": [3]},\n]\n')
    with pytest.raises(ValueError, match=r"broken.json, after element 2: a comma before the closing '\]'"):
        load_trace(path)


@pytest.mark.parametrize("record, msg", [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "holds a 'image_url' part; the lab replays text only"),
    ({"conversations": [{"from": "alien", "value": "hi"}]}, "is from 'alien'; ShareGPT turns are from one of"),
    ({"conversations": [{"from": ["human"], "value": "hi"}]}, "is from \\['human'\\]; ShareGPT turns are from one of"),
    ({"conversations": [{"from": "human"}]}, "message 1 \\(user\\) has no content; give it text"),
    ({"messages": [{"role": "user", "content": None}]}, "message 1 \\(user\\) has no content"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "message 1's role is 'robot'; give one of: system, developer"),
    ({"messages": [A("Hello! How can I help?")]}, "no answer to replay: the conversation holds no assistant answer"),
    ({"messages": ["hi"]}, "message 1 must be a JSON object"),
    ({"messages": [{"content": "hi"}]}, "message 1's role is None; give one of"),
    ({"messages": [U(7)]}, "message 1's content must be text"),
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": [U("hi"), A("yo")], "output": "again"}, "end with the assistant's answer and the line gives an "
                                                        "output too"),
    ({"messages": [U("hi")], "output": "x", "output_ids": [1]}, "as output_ids or as output text, not both"),
    ({"messages": [U("hi")], "max_tokens": -1}, "'max_tokens' must be an integer >= 0"),
    ('{"messages": [{"role": "user", "content": "\\ud800"}]}', "lone UTF-16 surrogate"),
])
def test_a_bad_chat_record_is_a_malformed_line_that_says_what_to_change(tmp_path, chat, record, msg):
    path = write(tmp_path, [{"input_ids": [1]}, record])
    with pytest.raises(ValueError, match="line 2: malformed JSONL line: .*" + msg):
        load_trace(path, chat=chat)
    assert len(load_trace(path, chat=chat, on_error="skip")) == 1


def test_chats_without_a_chat_template_say_to_pass_a_tokenizer_that_has_one(tmp_path):
    for record in ({"messages": [U("hi")]}, SHAREGPT):
        with pytest.raises(ValueError, match=r"pass a tokenizer with a chat template \(--tokenizer\)"):
            load_trace(write(tmp_path, [record]))
    assert hf_chat(None) is None


def toy_template(think_prompt=False):
    """A chat template over characters: 1 opens a user turn, 2 an assistant's; earlier answers lose their thinking
    (as a reasoning model's template drops it); with think_prompt the generation prompt opens a thought (3)."""
    def template(messages, generation_prompt):
        ids = []
        for k, m in enumerate(messages):
            text = m["content"]
            if m["role"] == "assistant" and k < len(messages) - 1:
                text = text.split("</think>")[-1]
            ids += [1 if m["role"] == "user" else 2] + [ord(c) for c in text]
        return ids + ([2] + ([3] if think_prompt else []) if generation_prompt else [])
    return ChatTokenizer(template)


def test_a_template_that_drops_earlier_thinking_leaves_only_what_came_before_the_answer_cached(tmp_path):
    """The next prompt does not start with prompt + answer, so the answer is not reused (on a real engine
    neither): the second turn finds only the first prompt's [1, q, 2]."""
    convo = {"messages": [U("q"), A("<think>hm</think>yes"), U("r"), A("no")]}
    wl = load_trace(write(tmp_path, [convo]), chat=toy_template(), sessions=1)
    first, second = wl.requests
    assert first.output_ids().tolist() == [ord(c) for c in "<think>hm</think>yes"]
    assert second.prompt_ids().tolist() == [1, ord("q"), 2, *map(ord, "yes"), 1, ord("r"), 2]
    assert replay(wl, capacity_tokens=1000).hit_tokens == 3


def test_a_generation_prompt_the_template_does_not_write_before_the_answer_gives_the_answer_fresh_ids(tmp_path):
    convo = {"messages": [U("q"), A("yes")]}
    (r,) = load_trace(write(tmp_path, [convo]), chat=toy_template(think_prompt=True)).requests
    # prompt [1, q, 2, 3], the conversation [1, q, 2, y, e, s]: they part after 3 tokens, so the answer is 3 long
    assert r.prompt_ids().tolist() == [1, ord("q"), 2, 3] and not r.has_output_ids and r.output_len == 3


def test_limit_reads_only_the_records_its_first_requests_come_from(tmp_path, chat):
    path = write(tmp_path, [SHAREGPT, {"input_ids": [1]}, "{not json"])
    wl = load_trace(path, chat=chat, limit=2, sessions=2)
    assert [r.prompt_len for r in wl.requests][1] == 1 and len(wl) == 2    # the broken line is never read
    with pytest.raises(ValueError, match="sessions must be a positive number"):
        load_trace(path, chat=chat, sessions=0)


def test_a_workload_of_chats_is_an_ordinary_workload(tmp_path, chat):
    wl = load_trace(write(tmp_path, [SHAREGPT, SHAREGPT]), chat=chat, sessions=1)
    assert isinstance(wl, Workload) and [r.rid for r in wl.requests] == [0, 1, 2, 3]
    # the same conversation twice: the second copy finds all of the first cached, turn by turn
    res = replay(wl, capacity_tokens=10_000)
    # the second turn finds the first turn's prompt and answer; the copy's prompts are cached whole, and each
    # recomputes its last token (as the engine does, to have logits)
    first, _, again_first, again_second = wl.requests
    assert res.hit_tokens == first.cached_len + (again_first.prompt_len - 1) + (again_second.prompt_len - 1) == 110


def test_a_trace_past_what_the_lab_keeps_in_memory_stops_with_the_limit_to_give(tmp_path, monkeypatch, chat):
    from core.lab import workload_size
    path = write(tmp_path, [{"input_ids": [1] * 40}] * 5)
    monkeypatch.setattr(workload_size, "MAX_TRACE_TOKENS", 100)
    for on_error in ("raise", "skip"):       # not a malformed line to skip
        with pytest.raises(ValueError, match=r"t.jsonl, line 3: the first 3 record\(s\) hold more than 100 prompt "
                                             r"tokens, the most the lab keeps .* read fewer with --limit 2"):
            load_trace(path, on_error=on_error)
    assert len(load_trace(path, limit=2)) == 2


def test_the_array_reader_agrees_with_json_load_wherever_its_reads_cut_the_text(tmp_path, monkeypatch):
    """Reads of 1 to 13 bytes cut numbers, strings, escapes and multi-byte characters at every place."""
    import random

    from core.lab import json_records
    rng = random.Random(5)
    values = [{"input_ids": [rng.randrange(10 ** rng.randrange(1, 12)) for _ in range(rng.randrange(1, 6))],
               "text": "".join(rng.choice("aé€😀\"\\\n ") for _ in range(rng.randrange(0, 9))), "x": -1.5e-3}
              for _ in range(30)] + [12345, 1.5, -2e-3, 10, True, False, "tail", [1, [2]], None]
    for indent in (1, "\t"):
        path = tmp_path / "a.json"
        path.write_text("\ufeff\n" + json.dumps(values, indent=indent, ensure_ascii=False) + "\n\n", encoding="utf-8")
        for chunk in (1, 2, 3, 7, 13):
            monkeypatch.setattr(json_records, "READ_CHUNK", chunk)
            got = [v for _, v in json_records.records(path)]
            assert got == values, (indent, chunk)


def test_a_leading_assistant_message_is_context_and_a_tool_only_answer_has_no_text(tmp_path, tok, chat):
    """An app's greeting before the user speaks was not generated by any prompt in the trace: it is part of the
    prompts after it, not a request. An assistant turn that only called tools has no content, as the server
    takes it."""
    greeting = {"conversations": [{"from": "gpt", "value": "Hi! Ask me anything."}, {"from": "human", "value": "hi"},
                                  {"from": "gpt", "value": "Hello there"}]}
    tool_call = {"messages": [U("weather?"), {"role": "assistant", "content": None, "tool_calls": []},
                              {"role": "tool", "content": "sunny"}, A("It is sunny.")]}
    wl = load_trace(write(tmp_path, [greeting, tool_call]), chat=chat, sessions=1)
    assert [r.prompt_ids().tolist() for r in wl.requests] == [
        engine_ids(tok, [A("Hi! Ask me anything."), U("hi")]), engine_ids(tok, [U("weather?")]),
        engine_ids(tok, [U("weather?"), A(""), {"role": "tool", "content": "sunny"}])]


def test_max_tokens_is_the_length_only_of_a_record_that_gives_no_output(tmp_path, tok, chat):
    """A gateway's log keeps the request's cap next to the answer: the answer's length wins, no clash."""
    lines = [{"input_ids": [1, 2, 3], "output_ids": [4, 5], "max_tokens": 256},
             {"messages": [U("hi")], "output": "Hello", "max_tokens": 256},
             {"input_ids": [1, 2, 3], "output_len": 7, "max_tokens": 256},
             {"input_ids": [1, 2, 3], "conversation": "conv_1", "max_tokens": 9}]   # an id, as OpenAI logs keep
    wl = load_trace(write(tmp_path, lines), chat=chat)
    assert [r.output_len for r in wl.requests] == [2, 2, 7, 9]
    assert tok.decode(wl.requests[1].output_ids()) == "Hello<|im_end|>"


def test_an_answer_ends_at_any_token_the_model_stops_on_not_only_the_tokenizer_s_eos(tmp_path, tok):
    """Gemma's and Llama 3's end of turn is in generation_config.json, not the tokenizer's EOS: the engine stops
    there, so an answer's output does too (and the template's newline after it is not cached)."""
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    text = tok.convert_tokens_to_ids("<|endoftext|>")

    class OtherEos:                      # the default tokenizer, saying its EOS is <|endoftext|>
        chat_template, eos_token_id = tok.chat_template, text

        def apply_chat_template(self, *a, **kw):
            return tok.apply_chat_template(*a, **kw)

    path = write(tmp_path, [{"messages": [U("hi"), A("Hello")]}])
    alone = load_trace(path, chat=hf_chat(OtherEos())).requests[0].output_ids().tolist()
    both = load_trace(path, chat=hf_chat(OtherEos(), {im_end, text})).requests[0].output_ids().tolist()
    assert tok.decode(alone) == "Hello<|im_end|>\n" and tok.decode(both) == "Hello<|im_end|>"


def test_the_cli_reads_the_stop_tokens_beside_the_tokenizer(tmp_path, tok):
    from core.lab.__main__ import _stop_ids
    folder = tmp_path / "model"
    tok.save_pretrained(folder)
    assert _stop_ids(str(folder)) == set()                     # tokenizer files only: its EOS is all there is
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 7}))
    assert _stop_ids(str(folder)) == {0, 2, 7}


def test_one_conversation_that_holds_too_much_stops_at_the_turn_that_passes_the_cap(tmp_path, monkeypatch, chat):
    """A conversation repeats its history in every prompt: the cap is counted turn by turn, and the message does
    not suggest a --limit that cannot help."""
    from core.lab import workload_size
    long = {"messages": [m for k in range(40) for m in (U(f"question {k}"), A(f"answer {k}"))]}
    monkeypatch.setattr(workload_size, "MAX_TRACE_TOKENS", 2000)
    with pytest.raises(ValueError, match=r"line 1: the first 1 record\(s\) hold more than 2,000 prompt tokens, .*"
                                         r"this record alone does .*drop or split it"):
        load_trace(write(tmp_path, [long]), chat=chat)
    with pytest.raises(ValueError, match=r"line 2: the first 2 record\(s\) .* read fewer with --limit 1 \(limit=\)"):
        load_trace(write(tmp_path, [{"input_ids": [1] * 10}, long]), chat=chat)


def test_a_minified_array_longer_than_the_peek_reads_as_an_array_and_a_broken_first_line_stays_jsonl(
        tmp_path, monkeypatch):
    from core.lab import json_records
    monkeypatch.setattr(json_records, "PEEK_BYTES", 64)
    one_line = tmp_path / "min.json"
    one_line.write_text(json.dumps([{"input_ids": [k] * 5} for k in range(20)]))        # 460 bytes, no newline
    assert [r.prompt_ids()[0] for r in load_trace(one_line).requests] == list(range(20))
    broken = write(tmp_path, ['[{"role": "user", "content": "hi"}', {"input_ids": [1]}, {"input_ids": [2]}])
    assert [r.prompt_ids().tolist() for r in load_trace(broken, on_error="skip").requests] == [[1], [2]]
    with pytest.raises(ValueError, match="line 1: malformed JSONL line: not valid JSON"):
        load_trace(broken)
