"""Piped to a file, a sweep's progress is a handful of plain lines (core/lab/progress_lines.py), not a bar's
hundreds of redraws; on a terminal it stays a tqdm bar."""
from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

from core.lab.progress_lines import PlainProgress

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^progress: (\d+)/(\d+) points, (\d+)%; last \S+@[\d,]+: [\d.]+% \(\d+\.\d s\)$")


def test_a_piped_sweep_of_40_points_writes_ten_plain_lines_ending_at_100_percent():
    got = subprocess.run([sys.executable, "-m", "core.lab", "sweep", "--workload", "generated-shared-prefix",
                          "-p", "num_groups=4", "-p", "prompts_per_group=4", "-p", "system_prompt_len=64",
                          "-p", "question_len=8", "-p", "output_len=4", "--capacities", "80,120,160,240,320",
                          "--policies", "lru,lfu,fifo,slru,mru,filo,priority", "--workers", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    # a point running 15 s on a loaded box may add a heartbeat line ("..., running"); every other line is a tenth
    lines = [ln for ln in got.stderr.splitlines() if not ln.endswith(" s)") or ", running (" not in ln]
    assert "\r" not in got.stderr and len(lines) == 10, got.stderr      # 5 x (7 policies + the optimum) = 40
    parsed = [LINE.match(ln) for ln in lines]
    assert all(parsed), lines
    assert [int(m.group(1)) for m in parsed] == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    assert {int(m.group(2)) for m in parsed} == {40} and parsed[-1].group(3) == "100"


def test_quiet_writes_no_progress_at_all():
    got = subprocess.run([sys.executable, "-m", "core.lab", "sweep", "--workload", "few-shot", "-p", "num_requests=8",
                          "--capacities", "4k", "--policies", "lru", "--workers", "1", "--quiet"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0 and got.stderr == ""


def test_one_line_per_tenth_and_the_last_point_whatever_the_total():
    out = io.StringIO()
    p = PlainProgress(out)
    for done in range(1, 417):
        p.finished(done, 416, "lru@1: 0.0%")
    counts = [int(ln.split()[1].split("/")[0]) for ln in out.getvalue().splitlines()]
    assert counts == [42, 84, 125, 167, 208, 250, 292, 333, 375, 416]
    out = io.StringIO()
    p = PlainProgress(out)
    for done in (1, 2, 3):
        p.finished(done, 3, "lru@1: 0.0%")
    assert [ln.split()[1] for ln in out.getvalue().splitlines()] == ["1/3", "2/3", "3/3"]


def test_running_points_speak_only_after_a_silent_heartbeat():
    out = io.StringIO()
    p = PlainProgress(out, heartbeat=0.0)
    p.running(1.5, 4)
    assert out.getvalue().startswith("progress: 1.5/4 points, 38%, running (")
    out = io.StringIO()
    p = PlainProgress(out, heartbeat=3600.0)
    p.running(1.5, 4)
    assert out.getvalue() == ""
