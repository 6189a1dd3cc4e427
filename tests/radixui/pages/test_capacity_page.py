"""The Capacity lab page (AppTest): a preset sweep renders the chart and the exact table, bad input is a
message and never a traceback, uploaded traces are parsed (with line numbers when malformed), and the
"through the real model" run on a tiny workload shows equal outputs and a positive saving."""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from core.lab.host_tier import replay_with_host
from core.lab.optimal import Bounds
from core.lab.size import size
from core.lab.sweep import OPTIMAL, run_sweep
from core.lab.units import load_model_config
from radixui.panels import lab_inputs as li
from tests.radixui.pages.capacity_page import open_page, page_errors, result_frame, upload_trace

PRESET = "generated-shared-prefix"


def _set_params(at: AppTest, **params) -> None:
    for k, v in params.items():
        at.number_input(key=f"cap_p_{PRESET}_{k}").set_value(v)


def _run_sweep(at: AppTest, caps: str, policies: list[str]) -> None:
    at.text_input(key=f"cap_caps_{PRESET}").input(caps)
    at.multiselect(key="cap_policies").set_value(policies)
    at.button(key="cap_run").click()
    at.run()


def _chart_spec(at: AppTest) -> dict:
    return json.loads(at.get("plotly_chart")[0].proto.spec)


def _small(**extra):
    params = {**li.preset_params(PRESET), "num_groups": 4, "prompts_per_group": 5, **extra}
    return params, li.preset_workload(PRESET, params)


def test_page_renders_with_a_preset_and_no_model():
    at = open_page()
    assert [t.value for t in at.title] == ["Capacity lab"]
    assert not at.error
    assert at.text_input(key=f"cap_caps_{PRESET}").value == li.PRESET_CAPACITIES[PRESET]
    assert at.multiselect(key="cap_policies").value == li.DEFAULT_POLICIES
    assert not at.get("plotly_chart")          # nothing runs before the button


def test_both_bundled_mooncake_traces_load_with_their_own_defaults():
    at = open_page()
    at.radio(key="cap_source").set_value("Bundled Mooncake trace")
    at.run()
    assert at.selectbox(key="cap_bundled").options == ["synthetic", "conversation"]
    for name, requests in (("synthetic", "3,993"), ("conversation", "12,031")):
        at.selectbox(key="cap_bundled").set_value(name)
        at.run()
        assert not at.exception and not at.error
        assert any(f"{requests} requests" in c.value for c in at.caption)
        assert at.text_input(key=f"cap_caps_mooncake_{name}").value == li.MOONCAKE_TRACES[name].capacities
        assert at.number_input(key=f"cap_ps_mooncake_{name}").value == 512


def test_preset_sweep_renders_chart_and_the_exact_table():
    at = open_page()
    _set_params(at, num_groups=4, prompts_per_group=5)
    _run_sweep(at, "512, 1k, 2k", ["lru", "lfu", "mru"])
    assert not at.exception and not page_errors(at), (at.exception, page_errors(at))
    assert len(at.get("plotly_chart")) == 1
    table = next(d.value for d in at.dataframe if "capacity_tokens" in d.value.columns and "evictions" in d.value.columns)
    params, wl = _small()
    direct = run_sweep(wl, [512, 1000, 2000], ["lru", "lfu", "mru"], workers=1)
    want = direct.table()
    # 2k is more than the workload can fill (its distinct tokens, counted from the sequences, plus the longest
    # request held while it runs): replayed there, said in a note, and it hits as often as an infinite pool
    distinct = len({tuple(r.cached_ids()[:k].tolist()) for r in wl.requests for k in range(1, r.cached_len + 1)})
    need = distinct + max(r.cached_len for r in wl.requests)
    assert distinct == Bounds(wl, 1).distinct_pages and need < 2000
    assert any(f"2,000 tokens exceed the {need:,} tokens this workload can ever fill" in i.value for i in at.info)
    at_2k = table[table.capacity_tokens == 2000]
    assert len(at_2k) == 4 and set(at_2k.hit_tokens) == {direct.infinite.hit_tokens}   # 3 policies + the optimum
    assert len(table) == 3 * 3 + 3           # policies x capacities, plus the optimum at each capacity
    assert list(zip(table.policy, table.capacity_tokens)) == list(zip(want.policy, want.capacity_tokens))
    assert list(table.hit_rate) == list(want.hit_rate)        # exact, not approximately
    assert list(table.hit_tokens) == list(want.hit_tokens)
    assert set(table.policy) == {"lru", "lfu", "mru", OPTIMAL}
    reach = next(d.value for d in at.dataframe if "reached" in d.value.columns)
    assert dict(zip(reach.policy, reach.capacity_tokens.astype(object).where(reach.capacity_tokens.notna(), None))) \
        == direct.capacity_to_reach(0.9)
    labels = [b.label for b in at.get("download_button")]
    assert labels == ["Download CSV", "Download JSON"]
    inf = next(m.value for m in at.metric if m.label == "Infinite-capacity hit rate")
    assert inf == f"{direct.infinite_hit_rate:.1%}"


def test_chart_draws_every_policy_distinctly_with_page_size_spelled():
    at = open_page()
    _set_params(at, num_groups=4, prompts_per_group=5)
    _run_sweep(at, "512, 1k", ["lru", "lfu", "fifo", "slru"])
    spec = _chart_spec(at)
    lines = [t for t in spec["data"] if t["name"].split(" ")[0] in ("lru", "lfu", "fifo", "slru")]
    assert [t["name"].split(" ")[0] for t in lines] == ["lru", "lfu", "fifo", "slru"]   # "fifo (≈ lru here)"
    # none hides under another: at every capacity, four different (symbol, size) markers and four dashes
    for i in range(2):
        assert len({(t["marker"]["symbol"][i], t["marker"]["size"][i]) for t in lines}) == 4
    assert len({t["line"]["dash"] for t in lines}) == 4
    assert "page size 1" in spec["layout"]["title"]["text"] and "(page 1)" not in spec["layout"]["title"]["text"]
    assert spec["layout"]["legend"]["title"]["text"] == "policy (page size 1):"


def test_a_model_turns_gib_into_tokens_everywhere():
    at = open_page()
    _set_params(at, num_groups=4, prompts_per_group=5)
    at.selectbox(key="cap_model").set_value("Llama-3.1-8B")
    _run_sweep(at, "0.01GiB, 512", ["lru"])
    assert not at.exception and not page_errors(at), page_errors(at)
    gib_tokens = int(0.01 * 2 ** 30) // 131_072            # 81 tokens of 128 KiB each
    table = result_frame(at, "evictions")
    assert sorted(set(table.capacity_tokens)) == [gib_tokens, 512]
    assert list(table.capacity_bytes) == [c * 131_072 for c in table.capacity_tokens]
    assert list(table.capacity_gib) == [c * 131_072 / 2 ** 30 for c in table.capacity_tokens]
    ticks = _chart_spec(at)["layout"]["xaxis"]["ticktext"]
    assert ticks == [f"{gib_tokens}<br>{gib_tokens * 131072 / 2 ** 30:.3g} GiB", "512<br>0.0625 GiB"]
    assert "capacity_gib" in result_frame(at, "reached").columns
    at.selectbox(key="cap_kv_dtype").set_value("fp8")
    _run_sweep(at, "0.01GiB", ["lru"])
    assert list(result_frame(at, "evictions").capacity_tokens) == [2 * gib_tokens + 1] * 2   # half the bytes per token


def test_gib_without_a_model_is_a_message():
    at = open_page()
    _run_sweep(at, "1GiB", ["lru"])
    # the page's own control, not the CLI's flag
    assert any("is in bytes: pick a model in “Model (sizes the KV cache in bytes)”" in e and "--model-config" not in e
               for e in page_errors(at)), page_errors(at)


def test_the_size_question_is_answered_by_search():
    at = open_page()
    _set_params(at, num_groups=4, prompts_per_group=5)
    _run_sweep(at, "512, 1k", ["lru", "fifo"])
    at.button(key="cap_size_run").click()
    at.run()
    assert not at.exception and not page_errors(at), page_errors(at)
    got = result_frame(at, "replays")
    want = size(_small()[1], ["lru", "fifo"], 0.9, 1)
    assert list(got.policy) == [OPTIMAL, "lru", "fifo"]
    assert list(got.capacity_tokens) == [a.capacity_tokens for a in want]
    assert list(got.lower_tokens) == [a.lower_pages for a in want]
    assert list(got.monotone) == ["yes"] * 3


def test_the_host_tier_replays_every_policy():
    at = open_page()
    _set_params(at, num_groups=4, prompts_per_group=5)
    at.selectbox(key="cap_model").set_value("Qwen2.5-7B")
    _run_sweep(at, "512, 1k", ["lru", "lfu"])
    at.selectbox(key="cap_host_dev").set_value(512)
    at.text_input(key="cap_host_cap").input("2k")
    at.selectbox(key="cap_host_wp").set_value("write_back")
    at.button(key="cap_host_run").click()
    at.run()
    assert not at.exception and not page_errors(at), page_errors(at)
    got = result_frame(at, "host_hit_rate")
    kv = load_model_config("qwen2.5-7b")
    for i, pol in enumerate(["lru", "lfu"]):
        r = replay_with_host(_small()[1], 512, 2000, pol, 1, None, "write_back")
        assert (got.device_hit_tokens[i], got.host_hit_tokens[i], got.miss_tokens[i]) == \
            (r.device_hit_tokens, r.host_hit_tokens, r.miss_tokens)
        assert got.ttft_p99_with_host[i] == r.ttft(kv)["ttft_p99_with_host"]
    assert got.host_hit_tokens.sum() > 0
    at.text_input(key="cap_host_cap").input("lots")
    at.button(key="cap_host_run").click()
    at.run()
    assert any("Cannot replay with this host tier: cannot read capacity 'lots'" in e for e in page_errors(at)), page_errors(at)


@pytest.mark.parametrize("caps, page_size, policies, message", [
    ("1k, lots", 1, ["lru"], "cannot read capacity"),
    ("", 1, ["lru"], "give at least one capacity"),
    ("100, 4k", 512, ["lru"], "below one page of 512"),
    ("1k", 1, [], "pick at least one eviction policy"),
])
def test_bad_sweep_input_is_an_error_message_not_a_traceback(caps, page_size, policies, message):
    at = open_page()
    at.number_input(key=f"cap_ps_{PRESET}").set_value(page_size)
    _run_sweep(at, caps, policies)
    assert not at.exception
    assert any(message in e for e in page_errors(at)), page_errors(at)
    assert not at.get("plotly_chart")


def test_bad_workload_parameter_is_an_error_message():
    at = open_page()
    at.number_input(key=f"cap_p_{PRESET}_vocab_size").set_value(1)
    at.run()
    assert not at.exception
    assert any("vocab_size must be an integer in [2, 2^62], got 1" in e for e in page_errors(at)), page_errors(at)


def test_overlap_needs_timestamps_and_then_replays_with_overlap():
    at = open_page()
    assert at.toggle(key=f"cap_overlap_{PRESET}").disabled          # no request_rate: no timestamps
    _set_params(at, num_groups=4, prompts_per_group=5, request_rate=50.0)
    at.run()
    toggle = at.toggle(key=f"cap_overlap_{PRESET}")
    assert not toggle.disabled
    toggle.set_value(True)
    _run_sweep(at, "1k, 4k", ["lru"])
    assert not at.exception and not page_errors(at), page_errors(at)
    table = next(d.value for d in at.dataframe if "evictions" in d.value.columns)
    assert list(table[table.policy == "lru"].overlap) == [True, True]


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown eviction policy 'belady'; choose one of: lru, lfu"):
        li.parse_sweep_inputs("1k", ["lru", "belady"], 1)


# ----- uploads ------------------------------------------------------------------------------------
def test_uploaded_token_id_trace_runs_a_sweep():
    at = open_page()
    lines = [list(range(40)) + [100 + i] * 8 for i in range(6)]
    upload_trace(at, "mine.jsonl", "\n".join(json.dumps(x) for x in lines).encode())
    assert not at.exception and not page_errors(at), page_errors(at)
    key = next(t.key for t in at.text_input if t.key.startswith("cap_caps_upload_"))
    at.text_input(key=key).input("48, 96, 400")
    at.button(key="cap_run").click()
    at.run()
    assert not at.exception and not page_errors(at), page_errors(at)
    table = next(d.value for d in at.dataframe if "evictions" in d.value.columns)
    lru = table[table.policy == "lru"]
    # 6 prompts of 48 tokens sharing 40: at 400 tokens every later prompt hits its 40-token prefix
    assert lru.hit_rate.iloc[-1] == pytest.approx(5 * 40 / (6 * 48))


@pytest.mark.parametrize("data, message", [
    (b"[1, 2, 3]\n[4, 5\n", "mine.jsonl, line 2: malformed JSONL line: not valid JSON"),
    (b"", "mine.jsonl is empty"),
    (b'{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
     b'{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n',
     "mine.jsonl, line 2: malformed Mooncake line: input_length 600 needs ceil(600/512) = 2 hash_ids"),
])
def test_malformed_upload_is_an_error_with_the_line_number(data, message):
    at = open_page()
    upload_trace(at, "mine.jsonl", data)
    assert not at.exception
    assert any(message in e for e in page_errors(at)), page_errors(at)
    assert not any("/tmp" in e for e in page_errors(at))          # the temporary file never shows


def test_skip_malformed_lines_counts_them():
    wl = li.read_uploaded_trace(b"[1, 2, 3]\nnot json\n[1, 2, 4]\n", "t.jsonl", skip_bad_lines=True)
    assert len(wl) == 2 and wl.skipped_lines == 1 and wl.name == "t.jsonl"
    with pytest.raises(ValueError, match=r"t.jsonl, line 2: .*tick “Skip malformed lines”"):
        li.read_uploaded_trace(b"[1, 2, 3]\nnot json\n", "t.jsonl")
    with pytest.raises(ValueError, match=r"t.jsonl, line 1: .*not UTF-8 text \(byte 0xff at column 1\)"):
        li.read_uploaded_trace(b"\xff\xfe\x00", "t.jsonl")


def test_text_lines_use_the_given_tokenizer_only_when_needed():
    calls = []

    def tok(text):
        calls.append(text)
        return [ord(c) for c in text]

    li.read_uploaded_trace(b"[1, 2]\n", "ids.jsonl", tok)
    assert calls == []
    wl = li.read_uploaded_trace(b'{"text": "abc", "output_len": 2}\n', "t.jsonl", tok)
    assert calls == ["abc"] and list(wl.requests[0].prompt_ids()) == [97, 98, 99]


def test_mooncake_upload_defaults_to_page_size_512():
    at = open_page()
    upload_trace(at, "mc.jsonl", b'{"timestamp": 0, "input_length": 1000, "output_length": 2, "hash_ids": [1, 2]}\n'
                            b'{"timestamp": 5, "input_length": 700, "output_length": 2, "hash_ids": [1, 3]}\n')
    assert not page_errors(at), page_errors(at)
    ps = next(n for n in at.number_input if n.key.startswith("cap_ps_upload_"))
    assert ps.value == 512
    assert "Not available" not in " ".join(i.value for i in at.info)   # no results yet, nothing said


def test_capacities_rounded_to_whole_pages_are_named_under_the_results():
    """Pages of 16: 100 and 200 tokens are pools of 96 and 192; the chart plotted those without a word."""
    at = open_page()
    _set_params(at, num_groups=4, prompts_per_group=5)
    at.number_input(key=f"cap_ps_{PRESET}").set_value(16)
    _run_sweep(at, "100, 200", ["lru"])
    assert not page_errors(at), page_errors(at)
    assert "Note: a pool holds whole pages of 16 tokens, so capacities are rounded down: 100 is 96 tokens, 200 is " \
           "192 tokens." in [i.value for i in at.info]


# ----- through the real model ---------------------------------------------------------------------
def test_through_the_real_model_saves_prefill_and_keeps_outputs():
    at = open_page(timeout=240)
    _set_params(at, num_groups=2, prompts_per_group=3, system_prompt_len=64, question_len=8, output_len=4)
    _run_sweep(at, "128, 512", ["lru"])
    assert not page_errors(at), page_errors(at)
    params = {**li.preset_params(PRESET), "num_groups": 2, "prompts_per_group": 3, "system_prompt_len": 64,
              "question_len": 8, "output_len": 4}
    wl = li.preset_workload(PRESET, params)
    at.selectbox(key="cap_m_cap").set_value(512)
    at.number_input(key="cap_m_new").set_value(2)
    at.button(key="cap_m_run").click()
    at.run()
    assert not at.exception and not page_errors(at), (at.exception, page_errors(at))
    assert any("identical with and without the cache" in s.value for s in at.success), [w.value for w in at.warning]
    # what the cache must save, derived from the prompts alone: nothing is evicted in this pool (2 x 64 system
    # tokens + 6 x (8 question + 1 generated) fit), so each prompt hits its longest common prefix with an earlier
    # one; the engine always computes a prompt's last token
    prompts = [list(r.prompt_ids() % 49152) for r in wl.requests]

    def common(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n
    want = sum(min(max([common(p, q) for q in prompts[:i]], default=0), len(p) - 1) for i, p in enumerate(prompts))
    assert want == 4 * 64                          # 2 groups of 3 prompts: 4 of them hit their 64-token system prompt
    table = next(d.value for d in at.dataframe if "prefill_s" in d.value.columns)
    on, off = table.iloc[0], table.iloc[1]
    assert on.cached_tokens == want and off.cached_tokens == 0 and on.prompt_tokens == off.prompt_tokens == 6 * 72
    metric = {m.label: m for m in at.metric}
    assert metric["Measured hit rate"].value == metric["Replay's prediction"].value == f"{want / (6 * 72):.1%}"
    assert metric["Prefill time saved"].value.endswith(" s")   # measured, so shown but not asserted on


def test_model_run_is_refused_for_a_large_workload_with_a_clear_message():
    at = open_page()
    _set_params(at, num_groups=10, prompts_per_group=6)
    _run_sweep(at, "1k, 4k", ["lru"])
    assert not page_errors(at)
    info = " ".join(i.value for i in at.info)
    assert "the workload has 60 requests; the model run takes at most 48" in info
    assert not [b for b in at.button if b.key == "cap_m_run"]


def test_suggested_capacities_fit_the_longest_request_and_a_pool_that_fits_none_says_so():
    """Two 1,024-token Mooncake requests (1,031 tokens with their output) at pages of 512: the page suggested
    "2p, 4p" (rounded down below the request), and a sweep at 2p showed 0 % with no word why (3 pages are
    1,536 tokens)."""
    line = {"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [7, 8]}
    data = "\n".join(json.dumps({**line, "timestamp": t}) for t in (0, 1)).encode()
    wl = li.read_uploaded_trace(data, "two.jsonl")
    assert li.suggest_capacities(wl, 512) == "3p, 5p"
    at = open_page()
    upload_trace(at, "two.jsonl", data)
    key = next(t.key for t in at.text_input if t.key.startswith("cap_caps_upload_"))
    at.text_input(key=key).input("2p, 3p")
    at.button(key="cap_run").click()
    at.run()
    assert not at.exception and not page_errors(at), page_errors(at)
    assert any("at 1,024 tokens nothing fits: the smallest request holds 1,536 tokens" in w.value for w in at.warning)

