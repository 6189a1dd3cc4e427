"""`python -m core.lab`: a sweep writes its files; bad input exits 2 with a message, no traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.lab.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_of_a_generated_workload(tmp_path, capsys):
    rc = main(["sweep", "--workload", "generated-shared-prefix", "-p", "num_groups=4", "-p", "prompts_per_group=3",
               "-p", "system_prompt_len=64", "-p", "question_len=8", "-p", "output_len=4", "-p", "order=grouped",
               "--capacities", "80,160,1k", "--policies", "lru,lfu", "--workers", "1", "--quiet",
               "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "infinite-capacity hit rate" in out and "smallest swept capacity reaching 90%" in out
    assert {p.name for p in tmp_path.iterdir()} == {"results.csv", "results.json", "chart.html"}
    data = json.loads((tmp_path / "results.json").read_text())
    # 1k is beyond the workload's 388 distinct pages + the running request's tail page: capped, with a note
    assert data["policies"] == ["lru", "lfu"] and data["capacities"] == [80, 160, 389]
    assert "note: capacity 1,000 tokens capped at 389 tokens" in out


def test_sweep_of_a_mooncake_slice_in_pages(mooncake_path, tmp_path, capsys):
    rc = main(["sweep", "--trace", str(mooncake_path), "--limit", "200", "--page-size", "512",
               "--capacities", "100p,400p", "--policies", "lru", "--workers", "1", "--quiet", "--no-optimal"])
    out = capsys.readouterr().out
    assert rc == 0 and "200 requests" in out and " 204800 " in out and " 400 " in out


def write(tmp_path, text, name="trace.jsonl"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("args, msg", [
    (["--workload", "few-shot", "--capacities", "100", "--policies", "lru,bogus"],
     "unknown eviction policy 'bogus'; choose one of: lru, lfu, fifo, mru, filo, priority, slru"),
    (["--workload", "few-shot", "--capacities", "100", "--page-size", "512"], "below one page of 512"),
    (["--workload", "few-shot", "--capacities", "1k", "-p", "colour=red"], "no parameter 'colour'"),
    (["--trace", "EMPTY", "--capacities", "1k"], "holds no requests"),
    (["--trace", "BAD", "--capacities", "1k"], "line 2: malformed"),
])
def test_bad_input_exits_2_with_a_message(args, msg, tmp_path, capsys):
    args = [{"EMPTY": write(tmp_path, "", "empty.jsonl"), "BAD": write(tmp_path, "[1,2]\n{nope\n", "bad.jsonl")}.get(a, a) for a in args]
    assert main(["sweep", *args, "--workers", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and "Traceback" not in err


def test_skip_bad_lines_counts_them(tmp_path, capsys):
    path = write(tmp_path, "[1,2,3]\n{nope\n[1,2,4]\n")
    assert main(["sweep", "--trace", path, "--skip-bad-lines", "--capacities", "8", "--workers", "1", "--quiet"]) == 0
    assert "1 malformed line(s) skipped" in capsys.readouterr().out


def test_module_help_runs_as_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "core.lab", "sweep", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--capacities" in out.stdout and "--page-size" in out.stdout
