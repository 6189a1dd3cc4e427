"""Trace import: the Mooncake trace itself, plain JSONL of ids or texts, and malformed input."""
from __future__ import annotations

import json

import pytest

from core.lab.traces import load_jsonl, load_mooncake, load_trace, order_notes


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
    ('{"timestamp": 0, "input_length": Infinity, "output_length": 3, "hash_ids": [1, 2]}', "'input_length'"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1e400, "hash_ids": [1, 2]}', "'output_length'"),
    ('{"timestamp": 0, "input_length": NaN, "output_length": 3, "hash_ids": [1, 2]}', "'input_length'"),
    ('{"timestamp": 1' + "0" * 330 + ', "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}',
     r"'timestamp' must be a finite number, got 1000000000000000000000000000000000000000\.\.\. \(331 characters\)"),
])
def test_malformed_mooncake_line_names_the_line(tmp_path, bad, msg):
    p = write(tmp_path, [MC, MC, bad, MC])
    with pytest.raises(ValueError, match=rf"line 3: .*{msg}"):
        load_mooncake(p)


def test_skip_mode_counts_malformed_lines(tmp_path):
    p = write(tmp_path, [MC, "{oops", {**MC, "hash_ids": []}, MC,
                         '{"timestamp": 0, "input_length": Infinity, "output_length": 3, "hash_ids": [1, 2]}'])
    w = load_mooncake(p, on_error="skip")
    assert len(w) == 2 and w.skipped_lines == 3


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
    ('{"input_ids": [1, 2, 3], "output_len": Infinity}', "'output_len'"),
    ('{"input_ids": [1], "timestamp": 9' + "9" * 400 + "}", "'timestamp' must be a finite number"),   # no OverflowError
    ('{"input_ids": [1], "output_len": 1' + "0" * 400 + ".5}", r"'output_len' must be an integer >= 0, got inf"),
])
def test_malformed_jsonl_line(tmp_path, bad, msg):
    p = write(tmp_path, [[1, 2], bad])
    with pytest.raises(ValueError, match=rf"line 2: .*{msg}"):
        load_jsonl(p)
    assert len(load_jsonl(p, on_error="skip")) == 1         # skippable: a ValueError, never an OverflowError


def test_unknown_format_and_on_error(tmp_path):
    p = write(tmp_path, [[1]])
    with pytest.raises(ValueError, match="auto, mooncake, jsonl"):
        load_trace(p, fmt="csv")
    with pytest.raises(ValueError, match="on_error"):
        load_jsonl(p, on_error="ignore")


# 64-bit content hashes: 2^41 * 512 = 2^50 is where the replay's fresh output ids start, 2^55 * 512 wraps int64
# onto 5 * 512, and 2^64 - 1 does not fit int64 at all. Renumbered densely at load, none of them collides.
BIG = [5, 1 << 41, (1 << 55) + 5, (1 << 64) - 1, (1 << 63) + 9]


def hashed_trace(ids):
    return [{"timestamp": 0, "input_length": 512, "output_length": 600, "hash_ids": [ids[0]]},  # outputs 2^50..
            {"timestamp": 1, "input_length": 1024, "output_length": 2, "hash_ids": [ids[0], ids[1]]},
            {"timestamp": 2, "input_length": 512, "output_length": 2, "hash_ids": [ids[2]]},
            {"timestamp": 3, "input_length": 1024, "output_length": 2, "hash_ids": [ids[3], ids[4]]},
            {"timestamp": 4, "input_length": 1024, "output_length": 2, "hash_ids": [ids[3], ids[4]]}]


def test_64_bit_hash_ids_give_the_hit_rates_of_the_same_trace_renumbered(tmp_path):
    from core.cache.eviction.registry import POLICIES
    from core.lab.optimal import Bounds
    from core.lab.replay import replay
    big = load_mooncake(write(tmp_path, hashed_trace(BIG), "big.jsonl"))
    small = load_mooncake(write(tmp_path, hashed_trace([0, 1, 2, 3, 4]), "small.jsonl"))
    assert [r.hash_ids.tolist() for r in big.requests] == [[0], [0, 1], [2], [3, 4], [3, 4]]
    # true answer: request 1 hits block 5 (512 tokens), request 4 the first of request 3's two blocks (its second
    # holds its last token, which the engine computes): 1,024
    for w in (big, small):
        b = Bounds(w, 512)
        assert b.infinite().hit_tokens == 1024 and b.optimal(3 * 512).hit_tokens == 1024
        for policy in POLICIES:
            for cap in (2, 4, 8):
                assert replay(w, cap * 512, policy, 512).hit_tokens == replay(small, cap * 512, policy, 512).hit_tokens
        assert replay(w, 8 * 512, "lru", 512).hit_tokens == 1024


def test_block_requests_with_huge_hash_ids_are_renumbered_by_the_workload():
    from core.lab.workloads import TraceRequest, Workload
    w = Workload("x", [TraceRequest(hash_ids=[1 << 60, 3], input_len=1024), TraceRequest(hash_ids=[1 << 60], input_len=512)])
    assert [r.hash_ids.tolist() for r in w.requests] == [[1, 0], [1]]
    with pytest.raises(ValueError, match="below 2\\^63"):
        TraceRequest(hash_ids=[1 << 64], input_len=512)
    with pytest.raises(ValueError, match="too large"):
        TraceRequest([1, 1 << 50])            # a token id in the output-id range


def test_gzipped_trace_reads_like_the_plain_one(tmp_path):
    import gzip
    plain = write(tmp_path, [MC, {**MC, "hash_ids": [1, 3]}])
    gz = tmp_path / "t.data"            # detected by the gzip magic, not the name
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = load_trace(plain), load_trace(gz)
    assert b.params["format"] == "mooncake"
    assert [r.hash_ids.tolist() for r in a.requests] == [r.hash_ids.tolist() for r in b.requests] == [[0, 1], [0, 2]]


def test_bundled_trace_is_the_published_file(mooncake_path):
    import gzip
    import hashlib
    assert mooncake_path.name == "synthetic_trace.jsonl.gz" and mooncake_path.parent.name == "mooncake"
    digest = hashlib.sha256(gzip.decompress(mooncake_path.read_bytes())).hexdigest()
    assert digest == "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"
    assert "Apache License" in (mooncake_path.parent / "LICENSE").read_text()


def test_a_utf8_bom_on_the_first_line_is_read_past(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(MC).encode() + b"\n" + json.dumps({**MC, "timestamp": 1}).encode() + b"\n")
    wl = load_trace(p)
    assert wl.params["format"] == "mooncake" and len(wl) == 2 and wl.requests[0].prompt_len == 600


@pytest.mark.parametrize("magic, kind", [(b"BZh91AY&SY", "bzip2"), (b"\xfd7zXZ\x00\x00", "xz"),
                                         (b"\x28\xb5\x2f\xfd\x00\x00", "zstd"), (b"PK\x03\x04\x14\x00", "zip")])
def test_a_trace_compressed_other_than_gzip_is_named(tmp_path, magic, kind):
    p = tmp_path / "t.jsonl.x"
    p.write_bytes(magic + b"\x00" * 64)
    with pytest.raises(ValueError, match=f"is {kind}-compressed.*decompress it"):
        load_trace(p)


def test_a_lone_surrogate_or_a_failing_tokenizer_is_a_malformed_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"text": "fine"}\n{"text": "a lone surrogate \\ud800 here"}\n{"text": "boom"}\n')

    def tok(text):
        if text == "boom":
            raise TypeError("this tokenizer cannot")
        return [ord(c) for c in text]
    with pytest.raises(ValueError, match=r"line 2: .*lone UTF-16 surrogate \(\\ud800\) at character 18"):
        load_jsonl(p, tok)
    wl = load_jsonl(p, tok, on_error="skip")
    assert len(wl) == 1 and wl.skipped_lines == 2                     # the tokenizer's TypeError: line 3, skipped
    boom = tmp_path / "boom.jsonl"
    boom.write_text('{"text": "boom"}\n')
    with pytest.raises(ValueError, match=r"line 1: .*the tokenizer could not read text \(TypeError: this tokenizer"):
        load_jsonl(boom, tok)


def test_requests_with_timestamps_replay_in_timestamp_order_and_say_how_many_moved(tmp_path):
    lines = [{"input_ids": [1, 2, 3], "timestamp": t, "output_len": 1} for t in (0, 20, 10, 30, 10)]
    for i, line in enumerate(lines):
        line["input_ids"] = [i + 1] * 3
    wl = load_jsonl(write(tmp_path, lines))
    assert [r.timestamp for r in wl.requests] == [0, 10, 10, 20, 30]
    assert [r.prompt_ids().tolist()[0] for r in wl.requests] == [1, 3, 5, 2, 4]    # ties keep the file's order
    assert wl.params["reordered"] == 4                                              # places that changed
    assert "reordered" not in load_jsonl(write(tmp_path, [{"input_ids": [1], "timestamp": t} for t in (0, 1)])).params
    mixed = load_jsonl(write(tmp_path, [{"input_ids": [1], "timestamp": 5}, {"input_ids": [2]}]))
    assert [r.prompt_ids().tolist() for r in mixed.requests] == [[1], [2]]          # not all timed: file order
    assert order_notes(wl) == ["4 requests were out of timestamp order in the file: replayed in timestamp order"]
    assert order_notes(mixed) == ["1 of 2 requests have no timestamp: the trace is replayed in file order, not in "
                                  "timestamp order"]                                # said, not silent
    assert order_notes(load_jsonl(write(tmp_path, [{"input_ids": [1]}, {"input_ids": [2]}]))) == []


def test_a_hash_id_trace_of_other_blocks_reads_with_its_block_size(tmp_path):
    p = write(tmp_path, [{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [7, 8, 9]},
                         {"timestamp": 1, "input_length": 20, "output_length": 2, "hash_ids": [7, 8]}])
    with pytest.raises(ValueError, match="--block-size"):
        load_trace(p)
    wl = load_trace(p, block_size=16)
    assert wl.params["block_size"] == 16 and [r.prompt_len for r in wl.requests] == [40, 20]
    assert wl.requests[1].prompt_ids().tolist() == wl.requests[0].prompt_ids().tolist()[:20]
    with pytest.raises(ValueError, match="block size must be a positive"):
        load_trace(p, block_size=0)


def test_a_mooncake_line_with_a_null_timestamp_is_malformed_and_overlap_says_what_is_missing(tmp_path):
    from core.lab.page_trace import Overlap
    from core.lab.sweep import run_sweep
    with pytest.raises(ValueError, match="line 2: .*missing field 'timestamp'"):
        load_mooncake(write(tmp_path, [MC, {**MC, "timestamp": None}]))
    half = load_jsonl(write(tmp_path, [{"input_ids": [1, 2], "timestamp": 0}, {"input_ids": [1, 3]}]))
    with pytest.raises(ValueError, match='1 of 2 have none \\(a trace: a "timestamp" on every line'):
        run_sweep(half, [4], ["lru"], 1, Overlap(), workers=1)


@pytest.mark.parametrize("line, msg", [({"input_ids": [1], "output": [5, 6]}, "output must be text, got list"),
                                       ({"input_ids": [1], "output_len": 2, "output_length": 99}, "disagree")])
def test_an_output_field_that_was_silently_ignored_is_named(tmp_path, line, msg):
    with pytest.raises(ValueError, match=msg):
        load_jsonl(write(tmp_path, [line]))
    assert load_jsonl(write(tmp_path, [{"input_ids": [1], "output_len": 3, "output_length": 3}])).requests[0].output_len == 3


def test_json_nested_too_deeply_is_a_malformed_line_not_a_recursion_error(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text("[" * 100_000 + "]" * 100_000 + "\n[1, 2]\n")
    with pytest.raises(ValueError, match="line 1: malformed JSONL line: JSON nested too deeply"):
        load_jsonl(p)
    assert load_jsonl(p, on_error="skip").skipped_lines == 1


@pytest.mark.parametrize("indent", [None, 1], ids=["one line", "indented"])
def test_a_json_array_of_token_id_lists_reads_as_one_request_each_however_it_is_written(tmp_path, indent):
    p = tmp_path / "ids.json"
    p.write_text(json.dumps([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]], indent=indent))
    wl = load_trace(p)
    assert [r.prompt_ids().tolist() for r in wl.requests] == [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('[[1, 2], [3, true]]\n[5, 6]\n')        # not a list of id lists: one malformed line
    with pytest.raises(ValueError, match="line 1: "):
        load_trace(mixed)



def test_an_empty_json_array_says_so_and_an_empty_first_token_list_is_still_a_malformed_line(tmp_path):
    """`[]` read as one malformed line: "holds no requests (1 malformed line(s) skipped)"."""
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    for on_error in ("raise", "skip"):
        with pytest.raises(ValueError, match="is an empty JSON array: it holds no requests"):
            load_trace(empty, on_error=on_error)
    lines = tmp_path / "ids.jsonl"
    lines.write_text("[]\n[1, 2, 3]\n")
    wl = load_trace(lines, on_error="skip")
    assert [r.prompt_ids().tolist() for r in wl.requests] == [[1, 2, 3]] and wl.skipped_lines == 1
    with pytest.raises(ValueError, match="line 1: malformed"):
        load_trace(lines)
