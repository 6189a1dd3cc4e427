"""`python -m core.lab` on a chat trace: --tokenizer's chat template, --sessions, and what it refuses."""
from __future__ import annotations

import json

from core.lab.__main__ import main


def test_a_sharegpt_file_sweeps_through_the_model_s_chat_template_with_its_sessions(tmp_path, capsys, smollm2_runner):
    """A ShareGPT JSON array (written over many lines) of two-turn conversations, read with the default model's
    tokenizer: the CLI says how the turns replay, and one session at a time finds every answer cached."""
    from core.engine.model.model_files import tokenizer_folder
    convos = [{"id": str(k), "conversations": [{"from": "human", "value": f"Question {k}?"},
                                                {"from": "gpt", "value": f"Answer {k}."},
                                                {"from": "human", "value": "Why?"}, {"from": "gpt", "value": "So."}]}
              for k in range(3)]
    trace = tmp_path / "sharegpt.json"
    trace.write_text(json.dumps(convos, indent=2))
    flags = ["--trace", str(trace), "--tokenizer", tokenizer_folder("default"), "--capacities", "10k",
             "--policies", "lru", "--workers", "1", "--quiet", "--no-optimal"]
    rates = {}
    for sessions in ("1", "3"):
        assert main(["sweep", *flags, "--sessions", sessions, "--out", str(tmp_path / sessions)]) == 0
        out = capsys.readouterr().out
        assert f"3 conversations of several turns: replayed {sessions} at a time, turn by turn (--sessions)" in out
        assert "workload sharegpt.json: 6 requests" in out
        rates[sessions] = json.loads((tmp_path / sessions / "results.json").read_text())["infinite"]["hit_tokens"]
    assert rates["1"] == rates["3"] > 0        # with room for everything, the order changes nothing
    assert main(["sweep", *flags, "--sessions", "0"]) == 2
    assert capsys.readouterr().err == "error: --sessions must be at least 1 (conversations in progress at once), got 0\n"
    assert main(["sweep", "--workload", "few-shot", "--capacities", "1k", "--sessions", "2"]) == 2
    assert "--sessions applies to --trace" in capsys.readouterr().err
    assert main(["sweep", "--trace", str(trace), "--capacities", "10k", "--workers", "1", "--quiet"]) == 2
    assert "pass a tokenizer with a chat template (--tokenizer)" in capsys.readouterr().err
