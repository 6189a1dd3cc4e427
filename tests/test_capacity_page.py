"""The Capacity lab page (AppTest): a preset sweep renders the chart and the exact table, bad input is a
message and never a traceback, uploaded traces are parsed (with line numbers when malformed), and the
"through the real model" run on a tiny workload shows equal outputs and a positive saving."""
from __future__ import annotations

import json
import pathlib

import pytest
from streamlit.testing.v1 import AppTest

from core.lab.sweep import OPTIMAL, run_sweep
from radixui import lab_inputs as li

APP = str(pathlib.Path(__file__).resolve().parents[1] / "app.py")
PAGE = "radixui/pages/capacity.py"
PRESET = "generated-shared-prefix"


def _page(timeout: float = 120) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


def _set_params(at: AppTest, **params) -> None:
    for k, v in params.items():
        at.number_input(key=f"cap_p_{PRESET}_{k}").set_value(v)


def _run_sweep(at: AppTest, caps: str, policies: list[str]) -> None:
    at.text_input(key=f"cap_caps_{PRESET}").input(caps)
    at.multiselect(key="cap_policies").set_value(policies)
    at.button(key="cap_run").click()
    at.run()


def _errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def test_page_renders_with_a_preset_and_no_model():
    at = _page()
    assert [t.value for t in at.title] == ["Capacity lab"]
    assert not at.error
    assert at.text_input(key=f"cap_caps_{PRESET}").value == li.PRESET_CAPACITIES[PRESET]
    assert at.multiselect(key="cap_policies").value == li.DEFAULT_POLICIES
    assert not at.get("plotly_chart")          # nothing runs before the button


def test_preset_sweep_renders_chart_and_the_exact_table():
    at = _page()
    _set_params(at, num_groups=4, prompts_per_group=5)
    _run_sweep(at, "512, 1k, 2k", ["lru", "lfu", "mru"])
    assert not at.exception and not _errors(at), (at.exception, _errors(at))
    assert len(at.get("plotly_chart")) == 1
    table = next(d.value for d in at.dataframe if "capacity_tokens" in d.value.columns and "evictions" in d.value.columns)
    params = {**li.preset_params(PRESET), "num_groups": 4, "prompts_per_group": 5}
    direct = run_sweep(li.preset_workload(PRESET, params), [512, 1000, 2000], ["lru", "lfu", "mru"], workers=1)
    want = direct.table()
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


@pytest.mark.parametrize("caps, page_size, policies, message", [
    ("1k, lots", 1, ["lru"], "cannot read capacity"),
    ("", 1, ["lru"], "give at least one capacity"),
    ("100, 4k", 512, ["lru"], "below one page of 512"),
    ("1k", 1, [], "pick at least one eviction policy"),
])
def test_bad_sweep_input_is_an_error_message_not_a_traceback(caps, page_size, policies, message):
    at = _page()
    at.number_input(key=f"cap_ps_{PRESET}").set_value(page_size)
    _run_sweep(at, caps, policies)
    assert not at.exception
    assert any(message in e for e in _errors(at)), _errors(at)
    assert not at.get("plotly_chart")


def test_bad_workload_parameter_is_an_error_message():
    at = _page()
    at.number_input(key=f"cap_p_{PRESET}_vocab_size").set_value(1)
    at.run()
    assert not at.exception
    assert any("vocab_size must be at least 2" in e for e in _errors(at)), _errors(at)


def test_overlap_needs_timestamps_and_then_replays_with_overlap():
    at = _page()
    assert at.toggle(key=f"cap_overlap_{PRESET}").disabled          # no request_rate: no timestamps
    _set_params(at, num_groups=4, prompts_per_group=5, request_rate=50.0)
    at.run()
    toggle = at.toggle(key=f"cap_overlap_{PRESET}")
    assert not toggle.disabled
    toggle.set_value(True)
    _run_sweep(at, "1k, 4k", ["lru"])
    assert not at.exception and not _errors(at), _errors(at)
    table = next(d.value for d in at.dataframe if "evictions" in d.value.columns)
    assert list(table[table.policy == "lru"].overlap) == [True, True]


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown eviction policy 'belady'; choose one of: lru, lfu"):
        li.parse_sweep_inputs("1k", ["lru", "belady"], 1)


# ----- uploads ------------------------------------------------------------------------------------
def _upload(at: AppTest, name: str, data: bytes) -> None:
    at.radio(key="cap_source").set_value("Upload a trace")
    at.run()
    at.file_uploader(key="cap_upload").set_value((name, data, "application/json"))
    at.run()


def test_uploaded_token_id_trace_runs_a_sweep():
    at = _page()
    lines = [list(range(40)) + [100 + i] * 8 for i in range(6)]
    _upload(at, "mine.jsonl", "\n".join(json.dumps(x) for x in lines).encode())
    assert not at.exception and not _errors(at), _errors(at)
    key = next(t.key for t in at.text_input if t.key.startswith("cap_caps_upload_"))
    at.text_input(key=key).input("48, 96, 400")
    at.button(key="cap_run").click()
    at.run()
    assert not at.exception and not _errors(at), _errors(at)
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
    at = _page()
    _upload(at, "mine.jsonl", data)
    assert not at.exception
    assert any(message in e for e in _errors(at)), _errors(at)
    assert not any("/tmp" in e for e in _errors(at))          # the temporary file never shows


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
    at = _page()
    _upload(at, "mc.jsonl", b'{"timestamp": 0, "input_length": 1000, "output_length": 2, "hash_ids": [1, 2]}\n'
                            b'{"timestamp": 5, "input_length": 700, "output_length": 2, "hash_ids": [1, 3]}\n')
    assert not _errors(at), _errors(at)
    ps = next(n for n in at.number_input if n.key.startswith("cap_ps_upload_"))
    assert ps.value == 512
    assert "Not available" not in " ".join(i.value for i in at.info)   # no results yet, nothing said


# ----- through the real model ---------------------------------------------------------------------
def test_through_the_real_model_saves_prefill_and_keeps_outputs():
    at = _page(timeout=240)
    _set_params(at, num_groups=2, prompts_per_group=3, system_prompt_len=64, question_len=8, output_len=4)
    _run_sweep(at, "256, 512", ["lru"])
    assert not _errors(at), _errors(at)
    at.selectbox(key="cap_m_cap").set_value(512)
    at.number_input(key="cap_m_new").set_value(2)
    at.button(key="cap_m_run").click()
    at.run()
    assert not at.exception and not _errors(at), (at.exception, _errors(at))
    assert any("identical with and without the cache" in s.value for s in at.success), [w.value for w in at.warning]
    metric = {m.label: m for m in at.metric}
    assert float(metric["Prefill time saved"].value.removesuffix(" s")) > 0
    assert metric["Measured hit rate"].value == metric["Replay's prediction"].value
    table = next(d.value for d in at.dataframe if "prefill_s" in d.value.columns)
    on, off = table.iloc[0], table.iloc[1]
    assert on.cached_tokens == 4 * 64 and off.cached_tokens == 0     # 2 groups of 3: 4 requests hit 64 tokens


def test_model_run_is_refused_for_a_large_workload_with_a_clear_message():
    at = _page()
    _set_params(at, num_groups=10, prompts_per_group=6)
    _run_sweep(at, "1k, 4k", ["lru"])
    assert not _errors(at)
    info = " ".join(i.value for i in at.info)
    assert "the workload has 60 requests; the model run takes at most 48" in info
    assert not [b for b in at.button if b.key == "cap_m_run"]
