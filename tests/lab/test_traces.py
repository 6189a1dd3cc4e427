"""Trace import: the Mooncake trace itself, plain JSONL of ids or texts, and malformed input."""
from __future__ import annotations

import json

import pytest

from core.lab.traces import load_jsonl, load_mooncake, load_trace


def write(tmp_path, lines, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return p


def test_mooncake_trace_loads_whole(mooncake):
    assert len(mooncake) == 3993
    assert mooncake.prompt_tokens == 61_194_628
    assert mooncake.is_block_trace and mooncake.has_timestamps
    r = mooncake.requests[0]
    assert r.prompt_len == 40160 and r.output_len == 6 and len(r.hash_ids) == 79 and r.timestamp == 0


def test_load_trace_detects_the_format(mooncake_path, tmp_path):
    assert load_trace(mooncake_path, limit=5).params["format"] == "mooncake"
    assert load_trace(write(tmp_path, [[1, 2, 3]])).params["format"] == "jsonl"


MC = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}


@pytest.mark.parametrize("bad, msg", [
    ("{not json", "not valid JSON"),
    ({**MC, "hash_ids": [1]}, "needs ceil"),
    ({k: v for k, v in MC.items() if k != "hash_ids"}, "missing field 'hash_ids'"),
    ({**MC, "input_length": -4}, "input_length"),
    ({**MC, "hash_ids": [1, "x"]}, "hash_ids"),
    ([1, 2], "JSON object"),
])
def test_malformed_mooncake_line_names_the_line(tmp_path, bad, msg):
    p = write(tmp_path, [MC, MC, bad, MC])
    with pytest.raises(ValueError, match=rf"line 3: .*{msg}"):
        load_mooncake(p)


def test_skip_mode_counts_malformed_lines(tmp_path):
    p = write(tmp_path, [MC, "{oops", {**MC, "hash_ids": []}, MC])
    w = load_mooncake(p, on_error="skip")
    assert len(w) == 2 and w.skipped_lines == 2


@pytest.mark.parametrize("content, msg", [("", "no requests"), ("\n\n", "no requests")])
def test_empty_trace_is_an_error(tmp_path, content, msg):
    p = tmp_path / "empty.jsonl"
    p.write_text(content)
    with pytest.raises(ValueError, match=msg):
        load_mooncake(p)
    with pytest.raises(ValueError, match=msg):
        load_jsonl(p)


def test_all_lines_malformed_in_skip_mode_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"no requests \(2 malformed"):
        load_mooncake(write(tmp_path, ["x", "y"]), on_error="skip")


def test_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read trace"):
        load_mooncake(tmp_path / "nope.jsonl")


def test_jsonl_token_ids_and_objects(tmp_path):
    p = write(tmp_path, [[5, 6, 7], {"input_ids": [5, 6, 8], "output_len": 4, "timestamp": 2.5},
                         {"tokens": [1], "output_ids": [9, 9]}])
    w = load_jsonl(p)
    assert [r.prompt_len for r in w.requests] == [3, 3, 1]
    assert [r.output_len for r in w.requests] == [1, 4, 2]
    assert w.requests[1].timestamp == 2.5 and list(w.requests[2].output_ids()) == [9, 9]


def test_jsonl_texts_need_a_tokenizer(tmp_path):
    p = write(tmp_path, [{"text": "a b c", "output": "d e"}, {"prompt": "a b x"}])
    with pytest.raises(ValueError, match="line 1: .*pass a tokenizer"):
        load_jsonl(p)
    vocab = {}
    tok = lambda s: [vocab.setdefault(w, len(vocab)) for w in s.split()]
    w = load_jsonl(p, tokenizer=tok)
    assert list(w.requests[0].prompt_ids()) == [0, 1, 2] and list(w.requests[0].output_ids()) == [3, 4]
    assert list(w.requests[1].prompt_ids()) == [0, 1, 5]


@pytest.mark.parametrize("bad, msg", [
    ([], "non-empty list"), ([1, -2], "non-negative"), ({"output_len": 3}, "no prompt"),
    ({"input_ids": [1], "output_ids": [1, 2], "output_len": 3}, "differs"), ("7", "list of token ids"),
])
def test_malformed_jsonl_line(tmp_path, bad, msg):
    p = write(tmp_path, [[1, 2], bad])
    with pytest.raises(ValueError, match=rf"line 2: .*{msg}"):
        load_jsonl(p)


def test_unknown_format_and_on_error(tmp_path):
    p = write(tmp_path, [[1]])
    with pytest.raises(ValueError, match="auto, mooncake, jsonl"):
        load_trace(p, fmt="csv")
    with pytest.raises(ValueError, match="on_error"):
        load_jsonl(p, on_error="ignore")
