"""Chat logs uploaded to the Capacity lab page: read through the engine's chat template, the sessions asked for,
and a trace past what the lab keeps in memory named with how many records to upload."""
from __future__ import annotations

import json

import pytest

from radixui.panels import lab_inputs as li
from tests.radixui.pages.capacity_page import open_page, page_errors, result_frame, upload_trace


def test_an_uploaded_sharegpt_file_reads_through_the_engine_s_chat_template_and_asks_how_many_at_once():
    """A ShareGPT JSON array: the engine's tokenizer reads it (the model loads on the first chat), the page offers
    "Conversations in progress at once" (16), and 1 replays each conversation to its end."""
    convos = [{"id": str(k), "conversations": [{"from": "human", "value": f"Question {k}?"},
                                                {"from": "gpt", "value": f"Answer {k}."},
                                                {"from": "human", "value": "Why?"}, {"from": "gpt", "value": "So."}]}
              for k in range(3)]
    at = open_page(timeout=300)
    upload_trace(at, "sharegpt.json", json.dumps(convos, indent=2).encode())
    assert not at.exception and not page_errors(at), page_errors(at)
    box = at.number_input(key="cap_sessions")
    assert box.value == 16 and "3 conversations of several turns" in box.help
    firsts = [r.prompt_len for r in at.session_state["cap_upload_parsed"][1].requests]
    box.set_value(1)
    at.run()
    wl = at.session_state["cap_upload_parsed"][1]
    assert wl.params["sessions"] == 1 and [r.prompt_len for r in wl.requests] == [firsts[i] for i in (0, 3, 1, 4, 2, 5)]
    key = next(t.key for t in at.text_input if t.key.startswith("cap_caps_upload_"))
    at.text_input(key=key).input("10000")
    at.button(key="cap_run").click()
    at.run()
    assert not at.exception and not page_errors(at), page_errors(at)
    assert result_frame(at, "evictions").hit_rate.iloc[0] > 0.5


def test_an_upload_past_what_the_lab_keeps_in_memory_says_how_many_records_to_upload(monkeypatch):
    from core.lab import workload_size
    monkeypatch.setattr(workload_size, "MAX_TRACE_TOKENS", 100)
    with pytest.raises(ValueError, match=r"^big.jsonl, line 3: the first 3 record\(s\) hold more than 100 prompt "
                                         r"tokens, .*; upload only the first 2 records$"):
        li.read_uploaded_trace(b"[" + b"1, " * 39 + b"1]\n" + (b"[" + b"2, " * 39 + b"2]\n") * 2, "big.jsonl")
